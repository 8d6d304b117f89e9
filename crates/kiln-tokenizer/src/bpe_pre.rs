//! The BPE pre-tokenizers llama.cpp knows, by `tokenizer.ggml.pre` name: each name's regex list
//! and the flags llama.cpp sets with it (`llama_vocab::impl::load` and `llm_tokenizer_bpe`).
//!
//! The regex lists are copied verbatim from llama.cpp's `llm_tokenizer_bpe` constructor (the
//! commented-out "original" regexes left out), so that [`crate::pretokenize`] can dispatch on their
//! exact text as llama.cpp does. Names llama.cpp does not know are refused, as llama.cpp refuses
//! them; so is `kimi-k2`, whose hand-written splitter is not ported.
//!
//! Invariant: every name accepted by [`bpe_settings`] compiles (a test builds them all).

use crate::TokenizerError;

/// What a `tokenizer.ggml.pre` name sets in llama.cpp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BpeSettings {
    /// llama.cpp's pre-tokenizer type (`LLAMA_VOCAB_PRE_TYPE_<kind>`).
    pub kind: &'static str,
    /// The regexes, applied in order.
    pub regexes: &'static [&'static str],
    /// A word that is itself a token is emitted whole.
    pub ignore_merges: bool,
    /// BOS is added by default (metadata may override).
    pub add_bos: bool,
    /// Words are mapped to GPT-2's byte stand-ins before merging (false: raw UTF-8, with
    /// `<0xNN>` byte fallback).
    pub byte_encode: bool,
    /// Spaces become `▁` before splitting, and back when decoding (SentencePiece-style BPE).
    pub escape_whitespaces: bool,
    /// There is no default BOS id (only the metadata's).
    pub no_default_bos: bool,
}

const BASE: BpeSettings = BpeSettings {
    kind: "DEFAULT",
    regexes: DEFAULT,
    ignore_merges: false,
    add_bos: false,
    byte_encode: true,
    escape_whitespaces: false,
    no_default_bos: false,
};

/// The settings for `tokenizer.ggml.pre = name` (`None` or empty: llama.cpp's "default").
pub(crate) fn bpe_settings(name: Option<&str>) -> Result<BpeSettings, TokenizerError> {
    let s = |kind: &'static str, regexes: &'static [&'static str]| BpeSettings {
        kind,
        regexes,
        ..BASE
    };
    let name = name.unwrap_or("");
    Ok(match name {
        "" | "default" => BASE,
        "minicpm5" => BpeSettings {
            ignore_merges: true,
            ..s("MINICPM5", MINICPM5)
        },
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => BpeSettings {
            ignore_merges: true,
            add_bos: true,
            ..s("LLAMA3", LLAMA3)
        },
        "deepseek-llm" => s("DEEPSEEK_LLM", DEEPSEEK_LLM),
        "deepseek-coder" => s("DEEPSEEK_CODER", DEEPSEEK_CODER),
        "deepseek-v3" => s("DEEPSEEK3_LLM", DEEPSEEK3_LLM),
        "spark2_5" => s("SPARK2_5", SPARK2_5),
        "youtu" => BpeSettings {
            ignore_merges: true,
            ..s("YOUTU", YOUTU)
        },
        "falcon" => s("FALCON", FALCON),
        "mpt" => s("MPT", GPT2),
        "starcoder" => s("STARCODER", STARCODER),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "exaone4" => s("GPT2", GPT2),
        "jais-2" => s("JAIS2", JAIS2),
        "gemma4" | "granite-embed-multi-311m" => BpeSettings {
            byte_encode: false,
            escape_whitespaces: true,
            ..s("GEMMA4", GEMMA4)
        },
        "sarvam-moe" => BpeSettings {
            byte_encode: false,
            escape_whitespaces: true,
            ..s("SARVAM_MOE", SARVAM_MOE)
        },
        "whitespace" => BpeSettings {
            byte_encode: false,
            ..s("WHITESPACE", WHITESPACE)
        },
        "refact" => s("REFACT", STARCODER),
        "command-r" => s("COMMAND_R", STARCODER),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => s("QWEN2", STABLELM2),
        "qwen35" => s("QWEN35", QWEN35),
        "stablelm2" => s("STABLELM2", STABLELM2),
        "olmo" => s("OLMO", GPT2),
        "dbrx" => s("DBRX", DBRX),
        "smaug-bpe" => s("SMAUG", DBRX),
        "poro-chat" => s("PORO", PORO),
        "chatglm-bpe" => BpeSettings {
            no_default_bos: true,
            ..s("CHATGLM4", CHATGLM4)
        },
        "glm4" | "glm5" => BpeSettings {
            no_default_bos: true,
            ignore_merges: true,
            ..s("CHATGLM4", CHATGLM4)
        },
        "viking" => s("VIKING", VIKING),
        "jais" => s("JAIS", GPT2),
        "tekken" => BpeSettings {
            ignore_merges: true,
            add_bos: true,
            ..s("TEKKEN", TEKKEN)
        },
        "smollm" => s("SMOLLM", STARCODER),
        "codeshell" => s("CODESHELL", STARCODER),
        "bloom" => s("BLOOM", PORO),
        "gpt3-finnish" => s("GPT3_FINNISH", PORO),
        "exaone" => s("EXAONE", STARCODER),
        "exaone-moe" => s("EXAONE_MOE", EXAONE_MOE),
        "chameleon" => BpeSettings {
            add_bos: true,
            ..s("CHAMELEON", CHAMELEON)
        },
        "minerva-7b" => s("MINERVA", STARCODER),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => s("GPT4O", GPT4O),
        "granite-embed-multi-97m" => BpeSettings {
            ignore_merges: true,
            ..s("GRANITE_EMB_MULTI", GRANITE_EMB_MULTI)
        },
        "tiny_aya" | "cohere2moe" => s("TINY_AYA", TINY_AYA),
        "superbpe" => s("SUPERBPE", SUPERBPE),
        "trillion" => s("TRILLION", GPT2),
        "granite-docling" => s("GRANITE_DOCLING", GPT2),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => s("BAILINGMOE", BAILINGMOE),
        "seed-coder" => s("SEED_CODER", SEED_CODER),
        "hunyuan" => s("HUNYUAN", STABLELM2),
        "hunyuan-dense" => s("HUNYUAN_DENSE", DEEPSEEK3_LLM),
        "hy_v4" => s("HY_V4", DEEPSEEK3_LLM),
        "joyai-llm" => s("JOYAI_LLM", DEEPSEEK3_LLM),
        "ufakzeka" => s("UFAKZEKA", UFAKZEKA),
        "grok-2" => s("GROK_2", GROK_2),
        "afmoe" => s("AFMOE", AFMOE),
        "laguna" => s("LAGUNA", LAGUNA),
        "minimax-m2" => s("MINIMAX_M2", GPT4O),
        "solar-open" => s("SOLAR_OPEN", STABLELM2),
        "mellum2" => s("MELLUM2", STARCODER),
        other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
    })
}

/// Every name [`bpe_settings`] accepts (for tests and error messages).
#[cfg(test)]
pub(crate) const NAMES: &[&str] = &[
    "default",
    "minicpm5",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "spark2_5",
    "youtu",
    "falcon",
    "mpt",
    "starcoder",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "jina-v1-en",
    "jina-v2-code",
    "roberta-bpe",
    "exaone4",
    "jais-2",
    "gemma4",
    "granite-embed-multi-311m",
    "sarvam-moe",
    "whitespace",
    "refact",
    "command-r",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "megrez",
    "qwen35",
    "stablelm2",
    "olmo",
    "dbrx",
    "smaug-bpe",
    "poro-chat",
    "chatglm-bpe",
    "glm4",
    "glm5",
    "viking",
    "jais",
    "tekken",
    "smollm",
    "codeshell",
    "bloom",
    "gpt3-finnish",
    "exaone",
    "exaone-moe",
    "chameleon",
    "minerva-7b",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "granite-embed-multi-97m",
    "tiny_aya",
    "cohere2moe",
    "superbpe",
    "trillion",
    "granite-docling",
    "bailingmoe",
    "bailingmoe2",
    "llada-moe",
    "seed-coder",
    "hunyuan",
    "hunyuan-dense",
    "hy_v4",
    "joyai-llm",
    "ufakzeka",
    "grok-2",
    "afmoe",
    "laguna",
    "minimax-m2",
    "solar-open",
    "mellum2",
];

/// Every regex list by llama.cpp's name for it (for tests).
#[cfg(test)]
pub(crate) const LISTS: &[(&str, &[&str])] = &[
    ("LLAMA3", LLAMA3),
    ("JAIS2", JAIS2),
    ("DBRX", DBRX),
    ("DEEPSEEK_LLM", DEEPSEEK_LLM),
    ("DEEPSEEK3_LLM", DEEPSEEK3_LLM),
    ("SPARK2_5", SPARK2_5),
    ("YOUTU", YOUTU),
    ("DEEPSEEK_CODER", DEEPSEEK_CODER),
    ("FALCON", FALCON),
    ("STARCODER", STARCODER),
    ("GPT2", GPT2),
    ("STABLELM2", STABLELM2),
    ("QWEN35", QWEN35),
    ("PORO", PORO),
    ("CHATGLM4", CHATGLM4),
    ("VIKING", VIKING),
    ("TEKKEN", TEKKEN),
    ("CHAMELEON", CHAMELEON),
    ("GPT4O", GPT4O),
    ("GRANITE_EMB_MULTI", GRANITE_EMB_MULTI),
    ("TINY_AYA", TINY_AYA),
    ("SUPERBPE", SUPERBPE),
    ("BAILINGMOE", BAILINGMOE),
    ("SEED_CODER", SEED_CODER),
    ("UFAKZEKA", UFAKZEKA),
    ("GROK_2", GROK_2),
    ("AFMOE", AFMOE),
    ("LAGUNA", LAGUNA),
    ("EXAONE_MOE", EXAONE_MOE),
    ("GEMMA4", GEMMA4),
    ("SARVAM_MOE", SARVAM_MOE),
    ("MINICPM5", MINICPM5),
    ("WHITESPACE", WHITESPACE),
    ("DEFAULT", DEFAULT),
];

// llama.cpp's regex lists, copied from `llm_tokenizer_bpe` (the doc line names every
// `LLAMA_VOCAB_PRE_TYPE_*` sharing the list there).

/// `LLAMA3`.
const LLAMA3: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `JAIS2`.
const JAIS2: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
];
/// `DBRX, SMAUG`.
const DBRX: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `DEEPSEEK_LLM`.
const DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
];
/// `DEEPSEEK3_LLM, HUNYUAN_DENSE, JOYAI_LLM, HY_V4`.
const DEEPSEEK3_LLM: &[&str] = &[
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];
/// `SPARK2_5`.
const SPARK2_5: &[&str] = &[
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
    "\\p{N}",
];
/// `YOUTU`.
const YOUTU: &[&str] = &[
    "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `DEEPSEEK_CODER`.
const DEEPSEEK_CODER: &[&str] = &[
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}",
];
/// `FALCON`.
const FALCON: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
];
/// `STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA, MELLUM2`.
const STARCODER: &[&str] = &[
    "\\p{N}",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
];
/// `GPT2, MPT, OLMO, JAIS, TRILLION, GRANITE_DOCLING`.
const GPT2: &[&str] =
    &["'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"];
/// `STABLELM2, QWEN2, HUNYUAN, SOLAR_OPEN`.
const STABLELM2: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `QWEN35`.
const QWEN35: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `PORO, BLOOM, GPT3_FINNISH`.
const PORO: &[&str] = &[" ?[^(\\s|.,!?…。，、।۔،)]+"];
/// `CHATGLM4`.
const CHATGLM4: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `VIKING`.
const VIKING: &[&str] = &[" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"];
/// `TEKKEN`.
const TEKKEN: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `CHAMELEON`.
const CHAMELEON: &[&str] = &[
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
];
/// `GPT4O, MINIMAX_M2`.
const GPT4O: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `GRANITE_EMB_MULTI`.
const GRANITE_EMB_MULTI: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `TINY_AYA`.
const TINY_AYA: &[&str] = &[
    "\\d{1,3}(?=(?:\\d{3})*\\b)",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `SUPERBPE`.
const SUPERBPE: &[&str] = &["\\p{N}+", "(?=(\\d{3})+(?!\\d))"];
/// `BAILINGMOE`.
const BAILINGMOE: &[&str] = &[
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
];
/// `SEED_CODER`.
const SEED_CODER: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `UFAKZEKA`.
const UFAKZEKA: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `GROK_2`.
const GROK_2: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `AFMOE`.
const AFMOE: &[&str] = &[
    "\\p{AFMoE_digits}",
    "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `LAGUNA`.
const LAGUNA: &[&str] = &[
    "[^\\n]+|[\\n]+",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `EXAONE_MOE`.
const EXAONE_MOE: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
];
/// `GEMMA4`.
const GEMMA4: &[&str] = &["[^\\n]+|[\\n]+"];
/// `SARVAM_MOE`.
const SARVAM_MOE: &[&str] = &["[^\\n]+|[\\n]+"];
/// `MINICPM5`.
const MINICPM5: &[&str] = &[
    "\\p{N}{1,3}",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
/// `WHITESPACE`.
const WHITESPACE: &[&str] = &["\\S+"];
/// `DEFAULT` (also a missing or empty `tokenizer.ggml.pre`).
const DEFAULT: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
];

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pretokenize::PreTokenizer;

    #[test]
    fn every_known_name_compiles() {
        for &name in NAMES {
            let settings = bpe_settings(Some(name)).unwrap();
            let pre = PreTokenizer::new(settings.regexes)
                .unwrap_or_else(|e| panic!("{name} ({}): {e}", settings.kind));
            let text = "Hello, y'all! 12345 ½ Ünï\u{301}cödé 🦙\n\n\t  x 漢字 ｶﾀｶﾅ";
            assert_eq!(pre.split_words(text).concat(), text, "{name}");
        }
    }

    /// `tests/fixtures/llama_cpp_splits/splits.json` (see its `gen.py`): llama.cpp's own splits.
    pub(crate) fn llama_cpp_splits() -> serde_json::Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/llama_cpp_splits/splits.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// The fixture's lengths of the words llama.cpp made of `text` with `list`.
    pub(crate) fn expected_lengths(case: &serde_json::Value, list: &str) -> Vec<usize> {
        let split = case["splits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["lists"].as_array().unwrap().iter().any(|l| l == list))
            .unwrap_or_else(|| panic!("{list} missing for {case}"));
        let lengths = split["lengths"].as_str().unwrap();
        lengths
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| l.parse().unwrap())
            .collect()
    }

    #[test]
    fn regex_lists_are_llama_cpps() {
        let fixture = llama_cpp_splits();
        let theirs = fixture["lists"].as_object().unwrap();
        assert_eq!(theirs.len(), LISTS.len());
        for (name, ours) in LISTS {
            let theirs: Vec<&str> = theirs[*name]
                .as_array()
                .unwrap_or_else(|| panic!("{name}"))
                .iter()
                .map(|r| r.as_str().unwrap())
                .collect();
            assert_eq!(&theirs, ours, "{name}");
        }
    }

    #[test]
    fn splits_are_llama_cpps() {
        let fixture = llama_cpp_splits();
        let cases = fixture["cases"].as_array().unwrap();
        assert!(cases.len() > 100);
        for (name, list) in LISTS {
            let pre = PreTokenizer::new(list).unwrap();
            for case in cases {
                let text = case["text"].as_str().unwrap();
                let ours: Vec<usize> = pre.split_words(text).iter().map(|w| w.len()).collect();
                assert_eq!(ours, expected_lengths(case, name), "{name} on {text:?}");
            }
        }
    }

    #[test]
    fn unknown_names_are_refused() {
        for name in ["kimi-k2", "no-such-tokenizer"] {
            let err = bpe_settings(Some(name)).unwrap_err();
            assert!(
                matches!(err, TokenizerError::UnsupportedPreTokenizer(ref p) if p == name),
                "{err}"
            );
        }
        assert_eq!(
            bpe_settings(None).unwrap(),
            bpe_settings(Some("default")).unwrap()
        );
    }
}
