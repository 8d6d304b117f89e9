//! kiln-formats: kiln: memory-mapped GGUF (and later safetensors) readers
