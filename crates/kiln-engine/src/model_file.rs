//! [`ModelFile`]: a model opened once from its path — what it is, its configuration, its cost
//! for the planner, its tokenizer and chat template — and loaded onto the backend(s) a plan
//! chose.
//!
//! Invariant: every file of a model is opened once per [`ModelFile`]. A GGUF file is mapped
//! (its header parsed, nothing more read) and its handle kept: a model to run from private
//! memory is read into it from that handle after the plan accepted it (see
//! [`GgufFile::hold_as`]). A Hugging Face folder's JSON files and `tokenizer.json` are read at
//! open and its safetensors mapped; everything later works from what was read.

use std::path::{Path, PathBuf};

use kiln_backend::Backend;
use kiln_core::config::{DecoderConfig, EncoderConfig};
use kiln_formats::{GgufFile, LoadMode, SafetensorsModel};
use kiln_models::hf::HfConfig;
use kiln_models::{Decoder, ModelError, SplitDecoder};
use kiln_tokenizer::{ChatTemplate, SpecialTokens, Tokenizer};
use serde_json::Value;

use crate::plan::{ModelCost, ModelShape};
use crate::text::{no_tokenizer_json, read_json, HfText};
use crate::{EmbeddingModel, EngineError, TextTokenizer};

/// What a [`ModelFile`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// A decoder in a GGUF file.
    GgufDecoder,
    /// A Hugging Face decoder folder (`config.json`, safetensors, `tokenizer.json`).
    HfDecoder,
    /// A Hugging Face / sentence-transformers encoder folder, for embeddings.
    HfEncoder,
}

impl ModelKind {
    pub fn is_decoder(self) -> bool {
        self != ModelKind::HfEncoder
    }

    /// A few words for messages.
    pub fn describe(self) -> &'static str {
        match self {
            ModelKind::GgufDecoder => "a GGUF decoder",
            ModelKind::HfDecoder => "a Hugging Face decoder folder",
            ModelKind::HfEncoder => "an embedding (encoder) folder",
        }
    }
}

/// A model opened from a path; see the module docs.
pub struct ModelFile {
    path: PathBuf,
    /// How a GGUF file's bytes are held once its weights are loaded.
    mode: LoadMode,
    source: Source,
}

enum Source {
    Gguf(Box<GgufFile>),
    Folder(Box<Folder>),
}

/// A Hugging Face folder, as read at open.
struct Folder {
    kind: ModelKind,
    config: HfConfig,
    checkpoint: SafetensorsModel,
    /// `tokenizer.json`'s bytes, when the folder has one.
    tokenizer_json: Option<Vec<u8>>,
    /// `tokenizer_config.json` (decoders), when there is one.
    tokenizer_config: Option<Value>,
    /// `generation_config.json` (decoders), when there is one.
    generation_config: Option<Value>,
    /// `chat_template.jinja` (decoders), when there is one.
    chat_template_jinja: Option<String>,
}

fn file_error(path: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::Input(format!("{}: {e}", path.display()))
}

impl ModelFile {
    /// Opens the model at `path`: a GGUF file, or a Hugging Face folder whose `config.json`
    /// names a decoder or an encoder family kiln runs. `mode` is how a GGUF file's bytes are
    /// held once [`ModelFile::load_decoder`] loads it (until then the file is only mapped).
    pub fn open(path: &Path, mode: LoadMode) -> Result<ModelFile, EngineError> {
        let source = if path.is_dir() {
            Source::Folder(Box::new(Folder::open(path)?))
        } else {
            let file = GgufFile::open_with(path, LoadMode::Map).map_err(ModelError::from)?;
            Source::Gguf(Box::new(file))
        };
        Ok(ModelFile {
            path: path.to_owned(),
            mode,
            source,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn kind(&self) -> ModelKind {
        match &self.source {
            Source::Gguf(_) => ModelKind::GgufDecoder,
            Source::Folder(f) => f.kind,
        }
    }

    /// How a GGUF file's bytes are held once loaded (see [`ModelFile::open`]).
    pub fn load_mode(&self) -> LoadMode {
        self.mode
    }

    /// The GGUF file, for a GGUF model.
    pub fn gguf(&self) -> Option<&GgufFile> {
        match &self.source {
            Source::Gguf(f) => Some(f),
            Source::Folder(_) => None,
        }
    }

    /// The safetensors checkpoint, for a folder.
    pub fn checkpoint(&self) -> Option<&SafetensorsModel> {
        self.folder().map(|f| &f.checkpoint)
    }

    /// The architecture's name: `general.architecture`, or `config.json`'s `model_type`.
    pub fn architecture(&self) -> &str {
        match &self.source {
            Source::Gguf(f) => f.architecture().unwrap_or("(none)"),
            Source::Folder(f) => f.config.model_type().unwrap_or("(none)"),
        }
    }

    /// An error for a command that needs a decoder (or an encoder) and was given the other.
    fn wrong_kind(&self, wanted: &str, hint: &str) -> EngineError {
        EngineError::Input(format!(
            "{}: not {wanted} ({}, model type {}); {hint}",
            self.path.display(),
            self.kind().describe(),
            self.architecture()
        ))
    }

    fn not_decoder(&self) -> EngineError {
        self.wrong_kind("a decoder", "use `kiln embed` for encoders")
    }

    fn not_encoder(&self) -> EngineError {
        self.wrong_kind(
            "an embedding model",
            "an embedding model is a folder (config.json, model.safetensors, tokenizer.json)",
        )
    }

    /// Whether this is a decoder; the error a command that runs one reports otherwise (before
    /// planning it).
    pub fn require_decoder(&self) -> Result<(), EngineError> {
        match self.kind().is_decoder() {
            true => Ok(()),
            false => Err(self.not_decoder()),
        }
    }

    /// Whether this is an embedding model; the error `kiln embed` reports otherwise.
    pub fn require_encoder(&self) -> Result<(), EngineError> {
        match self.kind() {
            ModelKind::HfEncoder => Ok(()),
            _ => Err(self.not_encoder()),
        }
    }

    fn folder(&self) -> Option<&Folder> {
        match &self.source {
            Source::Folder(f) => Some(f),
            Source::Gguf(_) => None,
        }
    }

    /// The decoder's configuration (an error for an encoder).
    pub fn decoder_config(&self) -> Result<DecoderConfig, EngineError> {
        match &self.source {
            Source::Gguf(f) => {
                let arch = f.architecture().ok_or_else(|| ModelError::Metadata {
                    key: "general.architecture".into(),
                    detail: "missing".into(),
                })?;
                Ok(kiln_models::arch::decoder_config(arch, f)?)
            }
            Source::Folder(f) if f.kind == ModelKind::HfDecoder => {
                Ok(kiln_models::arch::hf_decoder_shape(&f.config)?)
            }
            Source::Folder(_) => Err(self.not_decoder()),
        }
    }

    /// The encoder's configuration (an error for a decoder).
    pub fn encoder_config(&self) -> Result<EncoderConfig, EngineError> {
        match self.folder() {
            Some(f) if f.kind == ModelKind::HfEncoder => {
                Ok(kiln_models::arch::encoder_config(&f.config)?)
            }
            _ => Err(self.not_encoder()),
        }
    }

    /// What running the model costs, from its shape and tensors (nothing is loaded): what the
    /// planner weighs.
    pub fn cost(&self) -> Result<ModelCost, EngineError> {
        Ok(match &self.source {
            Source::Gguf(f) => ModelCost::from_gguf(f, self.decoder_config()?),
            Source::Folder(f) if f.kind == ModelKind::HfDecoder => {
                // A multimodal checkpoint's text model: only its tensors count.
                let prefix = kiln_models::arch::hf_weight_prefix(&f.config)?;
                let tied = kiln_models::arch::hf_tied(&f.config)?
                    && f.checkpoint
                        .tensor(&format!("{prefix}lm_head.weight"))
                        .is_none();
                let shape = ModelShape::Decoder(self.decoder_config()?);
                ModelCost::from_safetensors(&f.checkpoint, shape, tied, prefix)
            }
            Source::Folder(f) => {
                let shape = ModelShape::Encoder(self.encoder_config()?);
                ModelCost::from_safetensors(&f.checkpoint, shape, false, "")
            }
        })
    }

    /// The decoder's tokenizer: the GGUF's own, or the folder's `tokenizer.json` with its
    /// special tokens.
    pub fn tokenizer(&self) -> Result<TextTokenizer, EngineError> {
        match &self.source {
            Source::Gguf(f) => {
                let t = Tokenizer::from_gguf(f).map_err(|e| {
                    EngineError::Input(format!(
                        "{}: building the tokenizer from the GGUF metadata: {e}",
                        self.path.display()
                    ))
                })?;
                Ok(TextTokenizer::Gguf(Box::new(t)))
            }
            Source::Folder(f) if f.kind == ModelKind::HfDecoder => {
                let json = f
                    .tokenizer_json
                    .as_deref()
                    .ok_or_else(|| no_tokenizer_json(&self.path))?;
                let eos = [
                    f.generation_config
                        .as_ref()
                        .and_then(|g| g.get("eos_token_id")),
                    f.config.raw("eos_token_id"),
                ];
                let text = HfText::from_parts(&self.path, json, f.tokenizer_config.as_ref(), eos)?;
                Ok(TextTokenizer::Hf(Box::new(text)))
            }
            Source::Folder(_) => Err(self.not_decoder()),
        }
    }

    /// The model's own chat template (a GGUF's `tokenizer.chat_template`, or a folder's
    /// `chat_template.jinja` or `tokenizer_config.json`), with where it came from; `None` when
    /// it has none.
    pub fn chat_template(&self) -> Result<Option<(ChatTemplate, String)>, EngineError> {
        let template_error = |e| EngineError::Input(format!("the chat template: {e}"));
        match &self.source {
            Source::Gguf(f) => Ok(ChatTemplate::from_gguf(f)
                .map_err(template_error)?
                .map(|t| (t, "from the GGUF".to_string()))),
            Source::Folder(f) => {
                let Some(config) = &f.tokenizer_config else {
                    return Ok(f
                        .chat_template_jinja
                        .as_deref()
                        .map(|source| ChatTemplate::new(source, SpecialTokens::default()))
                        .transpose()
                        .map_err(template_error)?
                        .map(|t| (t, "from chat_template.jinja".to_string())));
                };
                let name = self.path.join("tokenizer_config.json");
                let name = name.display().to_string();
                let t = ChatTemplate::from_tokenizer_config_value(
                    &name,
                    config,
                    f.chat_template_jinja.as_deref(),
                )
                .map_err(template_error)?;
                let from = match f.chat_template_jinja {
                    Some(_) => "from chat_template.jinja",
                    None => "from tokenizer_config.json",
                };
                Ok(t.map(|t| (t, from.to_string())))
            }
        }
    }

    /// The special-token texts a chat template of the user's sees as `bos_token` and
    /// `eos_token`: the GGUF's, or those of `tokenizer` (the first of `end_ids` as EOS).
    pub fn special_tokens(
        &self,
        tokenizer: &TextTokenizer,
        end_ids: &[u32],
    ) -> Result<SpecialTokens, EngineError> {
        match &self.source {
            Source::Gguf(f) => SpecialTokens::from_gguf(f)
                .map_err(|e| EngineError::Input(format!("{}: {e}", self.path.display()))),
            Source::Folder(_) => {
                let piece = |id: Option<u32>| id.map(|i| tokenizer.piece(i)).unwrap_or_default();
                Ok(SpecialTokens {
                    bos: piece(tokenizer.bos()),
                    eos: piece(end_ids.first().copied()),
                })
            }
        }
    }

    /// A GGUF file's bytes held as this model's load mode says (a no-op for a folder).
    fn hold(&mut self) -> Result<(), EngineError> {
        if let Source::Gguf(f) = &mut self.source {
            f.hold_as(self.mode).map_err(ModelError::from)?;
        }
        Ok(())
    }

    /// Loads the decoder onto `backend`.
    pub fn load_decoder<B: Backend>(&mut self, backend: &B) -> Result<Decoder<B>, EngineError> {
        self.hold()?;
        match &self.source {
            Source::Gguf(f) => Ok(kiln_models::load_gguf_decoder(backend, f)?),
            Source::Folder(f) if f.kind == ModelKind::HfDecoder => Ok(
                kiln_models::load_hf_decoder_from(backend, &f.config, &f.checkpoint)?,
            ),
            Source::Folder(_) => Err(self.not_decoder()),
        }
    }

    /// Loads the decoder split after layer `front_layers`: the embedding and the first layers on
    /// `front`, the rest and the output on `back`.
    pub fn load_decoder_split<F: Backend, R: Backend>(
        &mut self,
        front: &F,
        back: &R,
        front_layers: usize,
    ) -> Result<SplitDecoder<F, R>, EngineError> {
        self.hold()?;
        match &self.source {
            Source::Gguf(f) => Ok(kiln_models::load_gguf_decoder_split(
                front,
                back,
                f,
                front_layers,
            )?),
            Source::Folder(f) if f.kind == ModelKind::HfDecoder => {
                Ok(kiln_models::load_hf_decoder_split_from(
                    front,
                    back,
                    &f.config,
                    &f.checkpoint,
                    front_layers,
                )?)
            }
            Source::Folder(_) => Err(self.not_decoder()),
        }
    }

    /// Loads the embedding model onto `backend`; with `truncate` false, over-long texts are
    /// refused instead of cut (see [`EmbeddingModel`]).
    pub fn load_embedding<B: Backend>(
        &self,
        backend: &B,
        truncate: bool,
    ) -> Result<EmbeddingModel<B>, EngineError> {
        let config = self.encoder_config()?;
        let Some(f) = self.folder() else {
            return Err(self.not_encoder());
        };
        let json = f.tokenizer_json.as_deref().ok_or_else(|| {
            EngineError::Input(format!(
                "{}: no tokenizer.json (an embedding model folder needs config.json, \
                 model.safetensors or model.safetensors.index.json, and tokenizer.json)",
                self.path.display()
            ))
        })?;
        EmbeddingModel::from_parts(backend, &self.path, config, &f.checkpoint, json, truncate)
    }
}

impl Folder {
    fn open(dir: &Path) -> Result<Folder, EngineError> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(EngineError::Input(format!(
                "{}: not a model folder kiln reads (no config.json; a Hugging Face folder has \
                 config.json, safetensors and tokenizer.json)",
                dir.display()
            )));
        }
        let config = HfConfig::read(&config_path)?;
        let model_type = config.model_type()?;
        let kind = if kiln_models::arch::SUPPORTED_HF_DECODERS.contains(&model_type) {
            ModelKind::HfDecoder
        } else if kiln_models::arch::SUPPORTED_ENCODERS.contains(&model_type) {
            ModelKind::HfEncoder
        } else {
            return Err(ModelError::UnsupportedArchitecture(format!(
                "{model_type} ({}: config.json model_type; decoders: {}; encoders: {})",
                dir.display(),
                kiln_models::arch::SUPPORTED_HF_DECODERS.join(", "),
                kiln_models::arch::SUPPORTED_ENCODERS.join(", ")
            ))
            .into());
        };
        let checkpoint = SafetensorsModel::open(dir).map_err(|e| file_error(dir, e))?;
        let read = |name: &str| -> Result<Option<Vec<u8>>, EngineError> {
            let path = dir.join(name);
            if !path.is_file() {
                return Ok(None);
            }
            std::fs::read(&path)
                .map(Some)
                .map_err(|e| file_error(&path, e))
        };
        let tokenizer_json = read("tokenizer.json")?;
        let decoder = kind == ModelKind::HfDecoder;
        let (tokenizer_config, generation_config, chat_template_jinja) = if decoder {
            let jinja = read("chat_template.jinja")?
                .map(|b| String::from_utf8(b).map_err(|e| file_error(dir, e)))
                .transpose()?;
            (
                read_json(&dir.join("tokenizer_config.json"))?,
                read_json(&dir.join("generation_config.json"))?,
                jinja,
            )
        } else {
            (None, None, None)
        };
        Ok(Folder {
            kind,
            config,
            checkpoint,
            tokenizer_json,
            tokenizer_config,
            generation_config,
            chat_template_jinja,
        })
    }
}
