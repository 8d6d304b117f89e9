//! A `tokenizer.json` token's bytes ([`HfTokenizer::token_bytes`], what constrained decoding
//! builds its token table from) equal what kiln's own GGUF tokenizer of the same model says the
//! token stands for, on every token of the fixture decoders' vocabularies: byte-level BPE
//! (Qwen 2/3) and SentencePiece with byte fallback (Llama, Mistral, Phi-3); special tokens are
//! the control tokens of the GGUF.

use std::path::Path;

use kiln_tokenizer::{HfTokenizer, Tokenizer, Truncation};

#[test]
fn tokenizer_json_token_bytes_equal_the_gguf_pieces() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/decoders");
    for (dir, gguf) in [
        ("llama", "model-f32.gguf"),
        ("mistral", "model-bf16.gguf"),
        ("phi3", "model-f32.gguf"),
        ("qwen2", "model-f16.gguf"),
        ("qwen3", "model-bf16.gguf"),
    ] {
        let dir = root.join(dir);
        let hf = HfTokenizer::from_file(&dir.join("tokenizer.json"), Truncation::None).unwrap();
        let file = kiln_formats::GgufFile::open(&dir.join(gguf)).unwrap();
        let own = Tokenizer::from_gguf(&file).unwrap();
        let n = own.vocab_size().min(hf.vocab_size());
        let mut compared = 0;
        for id in 0..n as u32 {
            if own.is_control(id) {
                assert!(
                    hf.special_text(id).is_some(),
                    "{}: token {id} is a control token of the GGUF, not special in tokenizer.json",
                    dir.display()
                );
                continue;
            }
            if hf.special_text(id).is_some() {
                continue; // special in tokenizer.json, user-defined text in the GGUF
            }
            assert_eq!(
                hf.token_bytes(id),
                own.token_to_piece(id, false),
                "{}: token {id} ({:?})",
                dir.display(),
                hf.id_to_token(id)
            );
            compared += 1;
        }
        assert!(
            compared > n / 2,
            "{}: only {compared} of {n} compared",
            dir.display()
        );
    }
}
