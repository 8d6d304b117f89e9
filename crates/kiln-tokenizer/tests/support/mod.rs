//! Test support: the reference data's places (kiln-testdata) and building a tokenizer from a file.

#![allow(dead_code, unused_imports)] // each test binary uses a different part

use std::path::Path;

pub use kiln_testdata::*;
use kiln_tokenizer::Tokenizer;

/// Opens a GGUF file and builds its tokenizer.
pub fn tokenizer_from_file(path: &Path) -> Tokenizer {
    let file = kiln_formats::GgufFile::open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    Tokenizer::from_gguf(&file)
        .unwrap_or_else(|e| panic!("cannot build the tokenizer of {}: {e}", path.display()))
}
