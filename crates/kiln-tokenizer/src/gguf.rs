//! Reading a [`VocabSpec`] from GGUF metadata.
//!
//! Types are checked as llama.cpp checks them, with the leniency of kiln-formats' accessors: ids
//! may be stored as any integer type; a negative id means "none"; scores may be f32 or integer
//! arrays. A wrong type is an error naming the key.

use kiln_formats::{GgufFile, MetaType, MetaValue};

use crate::vocab::keys;
use crate::{TokenizerError, VocabSpec};

fn array<'f>(
    file: &'f GgufFile,
    key: &str,
) -> Result<Option<&'f kiln_formats::MetaArray>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v.as_array().map(Some).ok_or_else(|| {
            TokenizerError::malformed(key, format!("expected an array, found {}", v.meta_type()))
        }),
    }
}

fn string_array(file: &GgufFile, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
    let Some(arr) = array(file, key)? else {
        return Ok(None);
    };
    if arr.elem_type != MetaType::String {
        return Err(TokenizerError::malformed(
            key,
            format!("expected an array of strings, found {}", arr.elem_type),
        ));
    }
    arr.items
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| TokenizerError::malformed(key, "an item is not a string"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn string(file: &GgufFile, key: &str) -> Result<Option<String>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v.as_str().map(|s| Some(s.to_owned())).ok_or_else(|| {
            TokenizerError::malformed(key, format!("expected a string, found {}", v.meta_type()))
        }),
    }
}

fn boolean(file: &GgufFile, key: &str) -> Result<Option<bool>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| {
            TokenizerError::malformed(key, format!("expected a bool, found {}", v.meta_type()))
        }),
    }
}

/// A token id: any integer; negative means absent; past `u32::MAX` it is out of every vocabulary
/// (and so ignored later, as llama.cpp ignores out-of-range ids).
fn token_id(file: &GgufFile, key: &str) -> Result<Option<u32>, TokenizerError> {
    let Some(v) = file.get(key) else {
        return Ok(None);
    };
    match (v.as_u64(), v.as_i64()) {
        (Some(id), _) => Ok(Some(u32::try_from(id).unwrap_or(u32::MAX))),
        (None, Some(_negative)) => Ok(None),
        (None, None) => Err(TokenizerError::malformed(
            key,
            format!("expected an integer token id, found {}", v.meta_type()),
        )),
    }
}

fn numbers<T>(
    file: &GgufFile,
    key: &str,
    allowed: &[MetaType],
    convert: impl Fn(&MetaValue) -> Option<T>,
) -> Result<Option<Vec<T>>, TokenizerError> {
    let Some(arr) = array(file, key)? else {
        return Ok(None);
    };
    if !allowed.contains(&arr.elem_type) {
        return Err(TokenizerError::malformed(
            key,
            format!("unexpected element type {}", arr.elem_type),
        ));
    }
    arr.items
        .iter()
        .map(|v| {
            convert(v).ok_or_else(|| TokenizerError::malformed(key, "an item is out of range"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The tokenizer metadata of `file` as a [`VocabSpec`].
pub(crate) fn spec_from_gguf(file: &GgufFile) -> Result<VocabSpec, TokenizerError> {
    let model =
        string(file, keys::MODEL)?.ok_or_else(|| TokenizerError::MissingKey(keys::MODEL.into()))?;
    let tokens = string_array(file, keys::TOKENS)?
        .ok_or_else(|| TokenizerError::MissingKey(keys::TOKENS.into()))?;
    let scores = numbers(file, keys::SCORES, &[MetaType::F32, MetaType::I32], |v| {
        v.as_f64().map(|x| x as f32)
    })?;
    let token_types = numbers(file, keys::TOKEN_TYPE, &[MetaType::I32], |v| {
        v.as_i64().and_then(|x| i32::try_from(x).ok())
    })?;
    // The deprecated FIM keys, where present, override the current ones (llama.cpp reads them
    // last).
    let fim = |current: &str, deprecated: &str| -> Result<Option<u32>, TokenizerError> {
        Ok(token_id(file, deprecated)?.or(token_id(file, current)?))
    };
    Ok(VocabSpec {
        model,
        pre: string(file, keys::PRE)?,
        tokens,
        scores,
        token_types,
        merges: string_array(file, keys::MERGES)?,
        bos_id: token_id(file, keys::BOS_ID)?,
        eos_id: token_id(file, keys::EOS_ID)?,
        eot_id: token_id(file, keys::EOT_ID)?,
        eom_id: token_id(file, keys::EOM_ID)?,
        unk_id: token_id(file, keys::UNK_ID)?,
        sep_id: token_id(file, keys::SEP_ID)?,
        pad_id: token_id(file, keys::PAD_ID)?,
        mask_id: token_id(file, keys::MASK_ID)?,
        fim_pre_id: fim(keys::FIM_PRE_ID, keys::PREFIX_ID)?,
        fim_suf_id: fim(keys::FIM_SUF_ID, keys::SUFFIX_ID)?,
        fim_mid_id: fim(keys::FIM_MID_ID, keys::MIDDLE_ID)?,
        fim_pad_id: token_id(file, keys::FIM_PAD_ID)?,
        fim_rep_id: token_id(file, keys::FIM_REP_ID)?,
        fim_sep_id: token_id(file, keys::FIM_SEP_ID)?,
        add_bos: boolean(file, keys::ADD_BOS)?,
        add_eos: boolean(file, keys::ADD_EOS)?,
        add_space_prefix: boolean(file, keys::ADD_SPACE_PREFIX)?,
        remove_extra_whitespaces: boolean(file, keys::REMOVE_EXTRA_WHITESPACES)?,
        precompiled_charsmap: numbers(
            file,
            keys::PRECOMPILED_CHARSMAP,
            &[MetaType::U8, MetaType::I8],
            |v| v.as_i64().map(|x| x as u8),
        )?,
        normalizer_lowercase: boolean(file, keys::NORMALIZER_LOWERCASE)?,
        normalizer_strip_accents: boolean(file, keys::NORMALIZER_STRIP_ACCENTS)?,
        model_name: string(file, keys::GENERAL_NAME)?,
        architecture: string(file, keys::GENERAL_ARCHITECTURE)?,
    })
}

/// The text of the token the id stored under `id_key` names in `tokenizer.ggml.tokens` (`None`
/// when either key is absent, the id is negative or out of range, or the item is not a string).
pub(crate) fn token_text(file: &GgufFile, id_key: &str) -> Result<Option<String>, TokenizerError> {
    let Some(id) = token_id(file, id_key)? else {
        return Ok(None);
    };
    let Some(tokens) = array(file, keys::TOKENS)? else {
        return Ok(None);
    };
    Ok(usize::try_from(id)
        .ok()
        .and_then(|i| tokens.items.get(i))
        .and_then(|v| v.as_str())
        .map(str::to_owned))
}
