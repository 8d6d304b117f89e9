//! Constrained decoding in the server: each decoder's token table (built once, on a thread of
//! its own, when the model is loaded), grammars compiled off the async runtime with a time
//! limit, and the adapter that lets the scheduler step a kiln-grammar constraint.
//!
//! Invariants: the table is built at most once per model and never on the model thread; a
//! grammar is compiled on a blocking thread, cached by its text in the table, and a compile that
//! fails or takes longer than [`COMPILE_LIMIT`] is a 400 naming the request field it came from.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kiln_engine::{Constraint, TextTokenizer, TokenConstraint};
use kiln_grammar::{GrammarError, GrammarSpec, Mask, TokenBytes, TokenTable, Vocabulary};

use crate::api::ApiError;

/// The longest a grammar may take to compile.
pub const COMPILE_LIMIT: Duration = Duration::from_secs(10);

/// A decoder's token table, built in the background from the moment the model is served.
pub struct Grammars {
    table: OnceLock<Result<Arc<TokenTable>, String>>,
    tokenizer: Arc<TextTokenizer>,
    width: usize,
}

impl Grammars {
    /// Starts building the table of `tokenizer` for logits `width` wide on a thread of its own.
    pub fn spawn(tokenizer: Arc<TextTokenizer>, width: usize) -> Arc<Grammars> {
        let g = Arc::new(Grammars {
            table: OnceLock::new(),
            tokenizer,
            width,
        });
        let bg = g.clone();
        let _ = std::thread::Builder::new()
            .name("kiln-token-table".into())
            .spawn(move || {
                let _ = bg.table();
            });
        g
    }

    /// The table (built now if the background thread has not yet; blocks until it is).
    fn table(&self) -> Result<Arc<TokenTable>, String> {
        self.table
            .get_or_init(|| {
                let started = std::time::Instant::now();
                let t = TokenTable::new(&TextVocab(&self.tokenizer), self.width)
                    .map(Arc::new)
                    .map_err(|e| e.to_string());
                match &t {
                    Ok(_) => tracing::debug!(
                        "token table of {} entries built in {:.0} ms",
                        self.width,
                        started.elapsed().as_secs_f64() * 1e3
                    ),
                    Err(e) => tracing::warn!("no constrained decoding for this model: {e}"),
                }
                t
            })
            .clone()
    }

    /// The ids of those of `texts` that are each one control token of the model's vocabulary
    /// (tool-call markers such as `[TOOL_CALLS]`), by text.
    pub async fn controls(
        self: &Arc<Self>,
        texts: &[&str],
    ) -> Result<Vec<(String, u32)>, ApiError> {
        let g = self.clone();
        let texts: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
        let job = tokio::task::spawn_blocking(move || {
            let table = g.table()?;
            Ok::<_, String>(
                texts
                    .into_iter()
                    .filter_map(|t| match g.tokenizer.encode(&t, false, true).ok()?[..] {
                        [id] if table.is_special(id) => Some((t, id)),
                        _ => None,
                    })
                    .collect(),
            )
        });
        match job.await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(ApiError::invalid(
                "tools",
                format!("tool calls are not available for this model: {e}"),
            )),
            Err(e) => Err(ApiError::invalid(
                "tools",
                format!("tool calls failed: {e}"),
            )),
        }
    }

    /// A constraint for one choice of a request: `spec` compiled (or taken from the cache) and
    /// started. `param` names the request field the grammar came from, for a 400.
    pub async fn start(
        self: &Arc<Self>,
        spec: &GrammarSpec,
        param: &str,
    ) -> Result<Constraint, ApiError> {
        let g = self.clone();
        let spec2 = spec.clone();
        let job = tokio::task::spawn_blocking(move || {
            let table = g.table().map_err(|e| (false, e))?;
            table
                .start(&spec2)
                .map(|c| {
                    Constraint::new(Grammar {
                        inner: c,
                        mask: None,
                    })
                })
                .map_err(|e| (matches!(e, GrammarError::Compile { .. }), e.to_string()))
        });
        match tokio::time::timeout(COMPILE_LIMIT, job).await {
            Err(_) => Err(ApiError::invalid(
                param,
                format!(
                    "the {} took longer than {} s to compile; simplify it",
                    spec.kind(),
                    COMPILE_LIMIT.as_secs()
                ),
            )),
            Ok(Err(join)) => Err(ApiError::invalid(
                param,
                format!("the {} could not be compiled: {join}", spec.kind()),
            )),
            Ok(Ok(Err((true, e)))) => Err(ApiError::invalid(param, format!("invalid {e}"))),
            Ok(Ok(Err((false, e)))) => Err(ApiError::invalid(
                param,
                format!("constrained decoding is not available for this model: {e}"),
            )),
            Ok(Ok(Ok(c))) => Ok(c),
        }
    }
}

/// A kiln-grammar constraint as the scheduler steps it.
struct Grammar {
    inner: kiln_grammar::Constraint,
    mask: Option<Mask>,
}

impl TokenConstraint for Grammar {
    fn prepare(&mut self) -> Result<(), String> {
        self.mask = Some(self.inner.allowed().map_err(|e| e.to_string())?);
        Ok(())
    }

    fn apply(&self, logits: &mut [f32]) {
        if let Some(m) = &self.mask {
            m.apply(logits);
        }
    }

    fn accepts(&mut self, token: u32) -> bool {
        self.inner.accepts(token)
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        self.mask = None;
        self.inner.commit(token).map_err(|e| e.to_string())
    }

    fn is_done(&self) -> bool {
        self.inner.is_done()
    }
}

/// A decoder's tokenizer as a grammar vocabulary.
struct TextVocab<'a>(&'a TextTokenizer);

impl Vocabulary for TextVocab<'_> {
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn token(&self, id: u32) -> TokenBytes {
        match self.0 {
            TextTokenizer::Gguf(t) => Vocabulary::token(t.as_ref(), id),
            TextTokenizer::Hf(h) => match h.tokenizer.special_text(id) {
                Some(text) => TokenBytes::Control(text),
                None => TokenBytes::Text(h.tokenizer.token_bytes(id)),
            },
        }
    }
    fn is_end_of_generation(&self, id: u32) -> bool {
        self.0.is_end_of_generation(id)
    }
    fn eos(&self) -> Option<u32> {
        match self.0 {
            TextTokenizer::Gguf(t) => t.eos(),
            TextTokenizer::Hf(h) => h.end_of_generation.iter().next().copied(),
        }
    }
    fn bos(&self) -> Option<u32> {
        self.0.bos()
    }
    fn eot(&self) -> Option<u32> {
        match self.0 {
            TextTokenizer::Gguf(t) => t.eot(),
            TextTokenizer::Hf(_) => None,
        }
    }
}
