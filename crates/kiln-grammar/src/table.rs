//! The token table of a model and the constraints it starts (see the crate docs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kiln_tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory, TokenParser};
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

use crate::{GrammarError, Result};

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// A JSON value that validates against this JSON schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// Text that matches this regular expression, whole.
    Regex(String),
    /// Text in the language of this Lark grammar (llguidance's dialect).
    Lark(String),
}

impl GrammarSpec {
    /// What kind of grammar this is, for errors.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema(_) => "JSON schema",
            GrammarSpec::JsonObject => "JSON object",
            GrammarSpec::Regex(_) => "regex",
            GrammarSpec::Lark(_) => "Lark grammar",
        }
    }

    /// The cache key: the kind and the text (a schema as serialized).
    fn key(&self) -> String {
        match self {
            GrammarSpec::JsonSchema(v) => format!("json:{v}"),
            GrammarSpec::JsonObject => "object".into(),
            GrammarSpec::Regex(r) => format!("regex:{r}"),
            GrammarSpec::Lark(g) => format!("lark:{g}"),
        }
    }

    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonSchema(v) => TopLevelGrammar::from_json_schema(bounded_whitespace(v)),
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(bounded_whitespace(&serde_json::json!({
                    "type": "object"
                })))
            }
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// The whitespace a JSON grammar allows between two tokens of the JSON text: none, a space, or
/// a line break and up to 20 spaces or tabs of indent (llama.cpp's bound). Unbounded
/// whitespace lets a small model pad forever instead of writing the value.
pub const JSON_WHITESPACE: &str = r"(?:\x20|\n[\x20\t]{0,20})";

/// `schema` with [`JSON_WHITESPACE`] as its whitespace, unless it sets llguidance's own
/// options (`x-guidance`). [`GrammarSpec::JsonSchema`] applies it; a JSON schema embedded in a
/// Lark grammar (`%json {...}`) needs it applied by whoever writes the grammar.
pub fn bounded_whitespace(schema: &serde_json::Value) -> serde_json::Value {
    let mut s = schema.clone();
    if let Some(o) = s.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }));
    }
    s
}

/// kiln's tokenizer as llguidance sees it: the table's trie, and greedy tokenization over it
/// (used only for text a grammar forces, which kiln does not ask for).
struct Env {
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// A vocabulary a [`TokenTable`] can be built from: kiln's own [`Tokenizer`] (GGUF files), or
/// whatever a caller wraps (a Hugging Face `tokenizer.json`).
pub trait Vocabulary {
    /// Tokens in the vocabulary (ids `0..vocab_size`).
    fn vocab_size(&self) -> usize;
    /// What token `id` stands for: the bytes it detokenizes to, or, for a control token, its
    /// text (such a token is never part of a grammar's text).
    fn token(&self, id: u32) -> TokenBytes;
    /// Whether `id` ends a generation (end of text, end of turn).
    fn is_end_of_generation(&self, id: u32) -> bool;
    /// The end-of-sequence and beginning-of-sequence tokens, and the end of a turn, if any.
    fn eos(&self) -> Option<u32>;
    fn bos(&self) -> Option<u32>;
    fn eot(&self) -> Option<u32>;
}

/// One entry of a [`Vocabulary`].
pub enum TokenBytes {
    /// Text: the bytes the token detokenizes to.
    Text(Vec<u8>),
    /// A control token, by its text.
    Control(String),
}

impl Vocabulary for Tokenizer {
    fn vocab_size(&self) -> usize {
        Tokenizer::vocab_size(self)
    }
    fn token(&self, id: u32) -> TokenBytes {
        if self.is_control(id) {
            TokenBytes::Control(self.token_text(id).unwrap_or("").to_string())
        } else {
            TokenBytes::Text(self.token_to_piece(id, false))
        }
    }
    fn is_end_of_generation(&self, id: u32) -> bool {
        Tokenizer::is_end_of_generation(self, id)
    }
    fn eos(&self) -> Option<u32> {
        Tokenizer::eos(self)
    }
    fn bos(&self) -> Option<u32> {
        Tokenizer::bos(self)
    }
    fn eot(&self) -> Option<u32> {
        Tokenizer::eot(self)
    }
}

/// How many compiled grammars a table keeps.
const CACHE_ENTRIES: usize = 64;

/// A model's tokens as byte strings, and the grammars compiled against them (see the crate docs).
pub struct TokenTable {
    factory: ParserFactory,
    width: usize,
    cache: Mutex<HashMap<String, TokenParser>>,
}

impl TokenTable {
    /// The table of `tokenizer`'s tokens, `logits_width` entries (the rows of the model's
    /// output; at least the tokenizer's vocabulary).
    pub fn new(tokenizer: &dyn Vocabulary, logits_width: usize) -> Result<TokenTable> {
        let vocab = tokenizer.vocab_size();
        if logits_width < vocab {
            return Err(GrammarError::Table(format!(
                "the logits have {logits_width} entries, fewer than the vocabulary's {vocab}"
            )));
        }
        let ends: Vec<u32> = (0..vocab as u32)
            .filter(|&id| tokenizer.is_end_of_generation(id))
            .collect();
        let Some(&first_end) = ends.first() else {
            return Err(GrammarError::Table(
                "the tokenizer has no end-of-generation token".into(),
            ));
        };
        let words: Vec<Vec<u8>> = (0..logits_width as u32)
            .map(|id| token_bytes(tokenizer, id))
            .collect();
        let info = TokRxInfo {
            vocab_size: logits_width as u32,
            tok_eos: tokenizer.eos().unwrap_or(first_end),
            tok_bos: tokenizer.bos(),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: tokenizer.eot(),
        };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
        let env: TokEnv = Arc::new(Env { trie });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Table(e.to_string()))?;
        factory.quiet();
        Ok(TokenTable {
            factory,
            width: logits_width,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Entries of the table (the logits' width).
    pub fn width(&self) -> usize {
        self.width
    }

    /// The bytes of token `id` as the table holds them (special tokens start with 0xFF).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.factory.tok_env().tok_trie().token(id)
    }

    /// Whether token `id` is marked special (a control token).
    pub fn is_special(&self, id: u32) -> bool {
        self.factory.tok_env().tok_trie().is_special_token(id)
    }

    /// Compiles `spec` (or takes it from the cache) and checks that it can start.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<TokenParser> {
        let key = spec.key();
        if let Some(p) = self.lock().get(&key) {
            return Ok(p.clone());
        }
        let parser =
            self.factory
                .create_parser(spec.top_level())
                .map_err(|e| GrammarError::Compile {
                    kind: spec.kind(),
                    detail: e.to_string(),
                })?;
        let mut cache = self.lock();
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, parser.clone());
        Ok(parser)
    }

    /// A constraint for one request: `spec` compiled (see [`TokenTable::compile`]) and started.
    pub fn start(&self, spec: &GrammarSpec) -> Result<Constraint> {
        let parser = self.compile(spec)?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Compile {
                kind: spec.kind(),
                detail: e,
            });
        }
        Ok(Constraint {
            matcher,
            width: self.width,
            ends: self.factory.tok_env().tok_trie().eos_tokens().to_vec(),
        })
    }

    /// The longest-match tokenization of `bytes` over the table (a valid, if not the model's
    /// own, tokenization of any text: tests feed grammars with it).
    pub fn greedy_tokenize(&self, bytes: &[u8]) -> Vec<u32> {
        self.factory.tok_env().tok_trie().greedy_tokenize(bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TokenParser>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Token `id`'s bytes: as kiln detokenizes it, or, for a control token, 0xFF and its text; none
/// past the vocabulary.
fn token_bytes(tokenizer: &dyn Vocabulary, id: u32) -> Vec<u8> {
    if id as usize >= tokenizer.vocab_size() {
        return Vec::new();
    }
    match tokenizer.token(id) {
        TokenBytes::Control(text) => {
            let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            b.extend_from_slice(text.as_bytes());
            b
        }
        TokenBytes::Text(bytes) => bytes,
    }
}

/// One request's grammar state.
pub struct Constraint {
    matcher: Matcher,
    width: usize,
    /// The end-of-generation tokens.
    ends: Vec<u32>,
}

/// The tokens a constraint allows next.
pub struct Mask(SimpleVob);

impl Mask {
    /// Whether token `id` is allowed.
    pub fn allows(&self, id: u32) -> bool {
        (id as usize) < self.0.len() && self.0.is_allowed(id)
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.0.num_set()
    }

    /// Sets every logit the mask does not allow to −∞ (`logits` is one row of the table's
    /// width).
    pub fn apply(&self, logits: &mut [f32]) {
        // A word of the bit set per 32 logits: most words are all-allowed or all-refused.
        let words = self.0.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX && chunk.len() == 32 {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

impl Constraint {
    /// The tokens the grammar allows next (end-of-generation tokens where it may end; only
    /// those once it is done). An empty set is an error: the grammar can no longer accept
    /// anything.
    pub fn allowed(&mut self) -> Result<Mask> {
        let m = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Step(e.to_string()))?;
        if m.is_zero() {
            return Err(GrammarError::Step(
                "the grammar allows no token here".into(),
            ));
        }
        debug_assert!(m.len() >= self.width.min(m.len()));
        Ok(Mask(m))
    }

    /// Takes the sampled token (which [`Constraint::allowed`] must have allowed; once the
    /// grammar is done, only an end-of-generation token).
    pub fn commit(&mut self, id: u32) -> Result<()> {
        if self.matcher.is_stopped() {
            return if self.ends.contains(&id) {
                Ok(())
            } else {
                Err(GrammarError::Step(format!(
                    "token {id} after the grammar's end"
                )))
            };
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| GrammarError::Step(e.to_string()))
    }

    /// Whether `id` may come next, without computing the whole mask (a few microseconds).
    pub fn accepts(&mut self, id: u32) -> bool {
        if self.matcher.is_stopped() {
            return self.ends.contains(&id);
        }
        if self.ends.contains(&id) {
            return self.is_accepting();
        }
        (id as usize) < self.width && self.matcher.validate_tokens(&[id]).is_ok_and(|n| n == 1)
    }

    /// Whether the grammar has ended: an end-of-generation token was taken, or nothing more can
    /// follow (the request should end, with an end-of-generation token or without).
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the text so far is a complete sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
