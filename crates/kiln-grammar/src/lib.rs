//! kiln-grammar: constrained decoding. A model's [`TokenTable`] (built once per model from
//! kiln's own tokenizer: each token id's bytes, special tokens marked, padded to the width of the
//! logits) compiles [`GrammarSpec`]s — a JSON schema, any JSON object, a regular expression, a
//! Lark grammar — with llguidance, and starts one [`Constraint`] per request. Per step the
//! constraint gives the set of tokens the grammar allows next ([`Constraint::allowed`]), and
//! takes the token sampled from them ([`Constraint::commit`]); it ends when the grammar does.
//!
//! Invariants:
//! - The table has exactly `logits_width` entries; ids past the tokenizer's vocabulary (padding
//!   rows of an embedding) have no bytes and are never allowed.
//! - A token's bytes are what kiln's detokenizer writes for it ([`kiln_tokenizer::Tokenizer::
//!   token_to_piece`]); control tokens are marked special (toktrie's 0xFF prefix) and are
//!   allowed only where a grammar names them or as the end of generation when it may end.
//! - Compiling is bounded by llguidance's fuel limits (a schema that would take too long is an
//!   error, not a stall) and happens off the model thread; compiled grammars are cached by their
//!   text, and each request gets its own copy of the parser state.
//! - Errors are typed ([`GrammarError`]) and name what was wrong; nothing here panics on a bad
//!   schema or grammar (llguidance's own panics are caught and become errors).
//!
//! Conformance: `tests/json_schema_suite.rs` runs the official JSON-Schema-Test-Suite (draft
//! 2020-12, committed under `tests/fixtures/json-schema-test-suite/`) through the compiler on
//! Gemma 3's table. A false positive (an instance the suite marks invalid that the grammar
//! accepts) fails the test unless it is listed in `tests/json_schema_suite_baseline.txt`, which
//! must match exactly (`KILN_UPDATE_BASELINE=1` rewrites it); with llguidance 1.9 it is empty,
//! because a schema with a keyword llguidance cannot enforce (`not`, `if`, `contains`,
//! `uniqueItems`, `unevaluated*`, `oneOf`, ...) is refused rather than approximated. Refused
//! schemas and valid instances refused (false negatives) are counted, not failed on.

mod table;

pub use table::{
    bounded_whitespace, Constraint, GrammarSpec, Mask, TokenBytes, TokenTable, Vocabulary,
    JSON_WHITESPACE,
};

/// What can go wrong building a table, compiling a grammar or stepping a constraint.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer cannot back a token table (no end-of-generation token, a vocabulary
    /// wider than the logits).
    #[error("token table: {0}")]
    Table(String),
    /// The schema, regex or grammar does not compile (the message names what and where).
    #[error("{kind}: {detail}")]
    Compile { kind: &'static str, detail: String },
    /// The constraint cannot go on: a token it did not allow, or a grammar that can no longer
    /// accept anything.
    #[error("constraint: {0}")]
    Step(String),
}

pub type Result<T> = std::result::Result<T, GrammarError>;
