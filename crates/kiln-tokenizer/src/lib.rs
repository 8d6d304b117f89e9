//! kiln-tokenizer: kiln: tokenizers from GGUF metadata
