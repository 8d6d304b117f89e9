//! Hugging Face model folders: `config.json` and the sentence-transformers files
//! (`modules.json`, the pooling module's `config.json`, `sentence_bert_config.json`).
//!
//! Every error names the file and, where there is one, the key.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::pooling::Pooling;
use crate::ModelError;

/// A parsed `config.json` with typed getters.
#[derive(Debug, Clone)]
pub struct HfConfig {
    file: String,
    json: Map<String, Value>,
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::File {
        file: path.display().to_string(),
        detail: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::File {
        file: path.display().to_string(),
        detail: format!("not valid JSON: {e}"),
    })
}

impl HfConfig {
    /// Reads `path` (a model folder's `config.json`).
    pub fn read(path: &Path) -> Result<Self, ModelError> {
        Self::from_value(&path.display().to_string(), read_json(path)?)
    }

    /// From JSON text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ModelError> {
        let v = serde_json::from_str(text).map_err(|e| ModelError::File {
            file: file.into(),
            detail: format!("not valid JSON: {e}"),
        })?;
        Self::from_value(file, v)
    }

    /// The configuration nested under `key` (a multimodal model's `text_config`); its errors
    /// name it as `config.json (text_config)`.
    pub fn nested(&self, key: &str) -> Result<Self, ModelError> {
        match self.json.get(key) {
            Some(v @ Value::Object(_)) => {
                Self::from_value(&format!("{} ({key})", self.file), v.clone())
            }
            _ => Err(self.error(key, "missing, or not a JSON object")),
        }
    }

    fn from_value(file: &str, v: Value) -> Result<Self, ModelError> {
        match v {
            Value::Object(json) => Ok(HfConfig {
                file: file.into(),
                json,
            }),
            _ => Err(ModelError::File {
                file: file.into(),
                detail: "expected a JSON object".into(),
            }),
        }
    }

    pub(crate) fn error(&self, key: &str, detail: impl Into<String>) -> ModelError {
        ModelError::Config {
            file: self.file.clone(),
            key: key.into(),
            detail: detail.into(),
        }
    }

    /// The raw JSON value of `key`.
    pub fn raw(&self, key: &str) -> Option<&Value> {
        self.json.get(key)
    }

    pub fn has(&self, key: &str) -> bool {
        self.json.get(key).is_some_and(|v| !v.is_null())
    }

    /// `model_type` ("bert", "xlm-roberta", "modernbert", ...).
    pub fn model_type(&self) -> Result<&str, ModelError> {
        self.str("model_type")
    }

    pub fn str(&self, key: &str) -> Result<&str, ModelError> {
        match self.json.get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(self.error(key, "expected a string")),
            None => Err(self.error(key, "missing")),
        }
    }

    pub fn str_or<'a>(&'a self, key: &str, default: &'a str) -> Result<&'a str, ModelError> {
        if !self.has(key) {
            return Ok(default);
        }
        self.str(key)
    }

    /// A positive integer no larger than 2³².
    pub fn usize(&self, key: &str) -> Result<usize, ModelError> {
        let v = self
            .json
            .get(key)
            .ok_or_else(|| self.error(key, "missing"))?;
        v.as_u64()
            .filter(|&n| n > 0 && n <= 1 << 32)
            .map(|n| n as usize)
            .ok_or_else(|| self.error(key, format!("expected a positive integer, found {v}")))
    }

    pub fn usize_or(&self, key: &str, default: usize) -> Result<usize, ModelError> {
        if !self.has(key) {
            return Ok(default);
        }
        self.usize(key)
    }

    /// [`usize`](Self::usize) of a key that transformers accepts under several spellings (its
    /// config classes' `attribute_map` aliases, e.g. `num_experts` / `num_local_experts`): the
    /// value of whichever spellings are present. Two spellings with different values are refused
    /// (transformers itself would keep one or the other depending on the key order); none is an
    /// error that names every accepted spelling.
    pub fn usize_any(&self, keys: &[&str]) -> Result<usize, ModelError> {
        let mut found: Option<(&str, usize)> = None;
        for &key in keys.iter().filter(|k| self.has(k)) {
            let v = self.usize(key)?;
            match found {
                Some((first, w)) if w != v => {
                    return Err(self.error(
                        key,
                        format!("{v} disagrees with {first} = {w} (two spellings of one setting)"),
                    ))
                }
                Some(_) => {}
                None => found = Some((key, v)),
            }
        }
        found.map(|(_, v)| v).ok_or_else(|| {
            self.error(
                keys.first().copied().unwrap_or(""),
                format!("missing (accepted spellings: {})", keys.join(", ")),
            )
        })
    }

    /// A non-negative integer (ids such as `pad_token_id`).
    pub fn u32_or(&self, key: &str, default: u32) -> Result<u32, ModelError> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.error(key, format!("expected a token id, found {v}"))),
        }
    }

    /// A finite number.
    pub fn f32(&self, key: &str) -> Result<f32, ModelError> {
        let v = self
            .json
            .get(key)
            .ok_or_else(|| self.error(key, "missing"))?;
        v.as_f64()
            .filter(|x| x.is_finite())
            .map(|x| x as f32)
            .ok_or_else(|| self.error(key, format!("expected a finite number, found {v}")))
    }

    pub fn f32_or(&self, key: &str, default: f32) -> Result<f32, ModelError> {
        if !self.has(key) {
            return Ok(default);
        }
        self.f32(key)
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.error(key, format!("expected true or false, found {v}"))),
        }
    }
}

/// What sentence-transformers does after the transformer: pooling, normalization, and the
/// longest input it feeds the model.
#[derive(Clone, Debug, PartialEq)]
pub struct SentenceConfig {
    pub pooling: Pooling,
    /// A `Normalize` module follows pooling (L2, unit-norm embeddings).
    pub normalize: bool,
    /// `sentence_bert_config.json`'s `max_seq_length` (tokens incl. specials), when given.
    pub max_seq_length: Option<usize>,
    /// Lowercase texts before tokenizing (`do_lower_case`).
    pub do_lower_case: bool,
    /// Files that were read (for logs), relative to the folder.
    pub sources: Vec<PathBuf>,
}

impl SentenceConfig {
    /// What sentence-transformers itself assumes for a plain Hugging Face folder: mean pooling,
    /// no normalization, no length limit beyond the model's.
    pub fn plain() -> Self {
        SentenceConfig {
            pooling: Pooling::Mean,
            normalize: false,
            max_seq_length: None,
            do_lower_case: false,
            sources: Vec::new(),
        }
    }

    /// Reads the sentence-transformers files of `dir`; a folder without `modules.json` gets
    /// [`SentenceConfig::plain`].
    pub fn read(dir: &Path) -> Result<Self, ModelError> {
        let mut cfg = Self::plain();
        let modules_path = dir.join("modules.json");
        if modules_path.is_file() {
            cfg.sources.push("modules.json".into());
            let file = modules_path.display().to_string();
            let bad = |detail: String| ModelError::File {
                file: file.clone(),
                detail,
            };
            let modules = read_json(&modules_path)?;
            let list = modules
                .as_array()
                .ok_or_else(|| bad("expected a JSON list of modules".into()))?;
            let mut pooling_path = None;
            for m in list {
                let ty = m
                    .get("type")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("module without a \"type\": {m}")))?;
                let path = m.get("path").and_then(Value::as_str).unwrap_or("");
                match ty.rsplit('.').next().unwrap_or(ty) {
                    "Transformer" => {}
                    "Pooling" => pooling_path = Some(path.to_string()),
                    "Normalize" => cfg.normalize = true,
                    other => {
                        return Err(bad(format!(
                            "module {other} ({ty}) is not supported; kiln runs \
                             Transformer, Pooling and Normalize"
                        )))
                    }
                }
            }
            if let Some(p) = pooling_path {
                if Path::new(&p)
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
                {
                    return Err(bad(format!("pooling path \"{p}\" leaves the model folder")));
                }
                let rel = Path::new(&p).join("config.json");
                cfg.pooling = Pooling::from_st_config(&HfConfig::read(&dir.join(&rel))?)?;
                cfg.sources.push(rel);
            }
        }
        let sbert = dir.join("sentence_bert_config.json");
        if sbert.is_file() {
            let c = HfConfig::read(&sbert)?;
            cfg.max_seq_length = if c.has("max_seq_length") {
                Some(c.usize("max_seq_length")?)
            } else {
                None
            };
            cfg.do_lower_case = c.bool_or("do_lower_case", false)?;
            cfg.sources.push("sentence_bert_config.json".into());
        }
        Ok(cfg)
    }
}

impl Pooling {
    /// From a sentence-transformers pooling `config.json` (exactly one mode may be set).
    pub fn from_st_config(c: &HfConfig) -> Result<Self, ModelError> {
        const MODES: [(&str, Option<Pooling>); 6] = [
            ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
            ("pooling_mode_cls_token", Some(Pooling::Cls)),
            ("pooling_mode_lasttoken", Some(Pooling::LastToken)),
            ("pooling_mode_max_tokens", Some(Pooling::Max)),
            (
                "pooling_mode_mean_sqrt_len_tokens",
                Some(Pooling::MeanSqrtLen),
            ),
            ("pooling_mode_weightedmean_tokens", None),
        ];
        let mut chosen = Vec::new();
        for (key, mode) in MODES {
            if c.bool_or(key, false)? {
                chosen.push((key, mode));
            }
        }
        if !c.bool_or("include_prompt", true)? {
            return Err(ModelError::Config {
                file: "pooling config".into(),
                key: "include_prompt".into(),
                detail: "false (instruction-excluding pooling) is not supported".into(),
            });
        }
        match chosen.as_slice() {
            [(_, Some(mode))] => Ok(*mode),
            [(key, None)] => Err(ModelError::Config {
                file: "pooling config".into(),
                key: (*key).into(),
                detail: "weighted-mean pooling is not supported".into(),
            }),
            [] => Err(ModelError::Config {
                file: "pooling config".into(),
                key: "pooling_mode_*".into(),
                detail: "no pooling mode is set".into(),
            }),
            many => Err(ModelError::Config {
                file: "pooling config".into(),
                key: many.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", "),
                detail: "several pooling modes at once (concatenated) are not supported".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_getters_name_file_and_key() {
        let c = HfConfig::parse(
            "config.json",
            r#"{"hidden_size": 384, "eps": 1e-12, "neg": -1, "name": "bert", "flag": true, "n": null}"#,
        )
        .unwrap();
        assert_eq!(c.usize("hidden_size").unwrap(), 384);
        assert_eq!(c.f32("eps").unwrap(), 1e-12);
        assert_eq!(c.str("name").unwrap(), "bert");
        assert!(c.bool_or("flag", false).unwrap());
        assert_eq!(c.usize_or("n", 7).unwrap(), 7);
        let e = c.usize("neg").unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("\"neg\""), "{e}");
        let e = c.usize("missing").unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
        assert!(c.str("hidden_size").is_err());
        assert!(HfConfig::parse("config.json", "[1]").is_err());
        assert!(HfConfig::parse("config.json", "{").is_err());
    }

    #[test]
    fn usize_any_takes_whichever_spelling_is_present() {
        let keys = ["num_experts", "num_local_experts"];
        let parse = |text: &str| HfConfig::parse("config.json", text).unwrap();
        assert_eq!(parse(r#"{"num_experts": 4}"#).usize_any(&keys).unwrap(), 4);
        assert_eq!(
            parse(r#"{"num_local_experts": 8}"#)
                .usize_any(&keys)
                .unwrap(),
            8
        );
        // Both spellings, agreeing; a null one counts as absent.
        let both = parse(r#"{"num_experts": 4, "num_local_experts": 4}"#);
        assert_eq!(both.usize_any(&keys).unwrap(), 4);
        let null = parse(r#"{"num_experts": null, "num_local_experts": 8}"#);
        assert_eq!(null.usize_any(&keys).unwrap(), 8);

        let e = parse(r#"{"hidden_size": 64}"#)
            .usize_any(&keys)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.json") && e.contains("num_experts, num_local_experts"),
            "{e}"
        );
        let e = parse(r#"{"num_experts": 4, "num_local_experts": 8}"#)
            .usize_any(&keys)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("num_local_experts") && e.contains("num_experts = 4"),
            "{e}"
        );
        // A present spelling with a bad value is reported as such, not skipped.
        let e = parse(r#"{"num_experts": 0, "num_local_experts": 8}"#)
            .usize_any(&keys)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"num_experts\"") && e.contains("positive integer"),
            "{e}"
        );
    }

    fn mode(json: &str) -> Result<Pooling, ModelError> {
        Pooling::from_st_config(&HfConfig::parse("1_Pooling/config.json", json).unwrap())
    }

    #[test]
    fn sentence_transformers_pooling_configs() {
        assert_eq!(
            mode(r#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true}"#).unwrap(),
            Pooling::Mean
        );
        assert_eq!(
            mode(r#"{"pooling_mode_cls_token": true}"#).unwrap(),
            Pooling::Cls
        );
        assert_eq!(
            mode(r#"{"pooling_mode_lasttoken": true}"#).unwrap(),
            Pooling::LastToken
        );
        assert!(mode("{}")
            .unwrap_err()
            .to_string()
            .contains("no pooling mode"));
        let e = mode(r#"{"pooling_mode_cls_token": true, "pooling_mode_max_tokens": true}"#)
            .unwrap_err();
        assert!(e.to_string().contains("several"), "{e}");
        assert!(mode(r#"{"pooling_mode_weightedmean_tokens": true}"#).is_err());
        assert!(mode(r#"{"pooling_mode_mean_tokens": "yes"}"#).is_err());
    }
}
