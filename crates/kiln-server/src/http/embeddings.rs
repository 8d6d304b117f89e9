//! `POST /v1/embeddings`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;

use super::errors::{body_bytes, engine_failure, Failure};
use super::ServerState;
use crate::api::{parse_body, ApiError, EmbeddingRequest, Input};
use crate::engine::EmbedInput;
use crate::responses::{EmbeddingList, EmbeddingObject, EmbeddingUsage, EmbeddingVector};

pub(super) async fn embeddings(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Failure> {
    let req: EmbeddingRequest = parse_body(&body_bytes(body)?)?;
    let e = state.embedder(&req.model)?;
    let v = req.validate(state.max_embed_inputs)?;
    if let Some(d) = v.dimensions.filter(|&d| d > e.engine.dim) {
        return Err(ApiError::invalid(
            "dimensions",
            format!(
                "{d} is more than the {} values of '{}''s vectors",
                e.engine.dim, e.name
            ),
        )
        .into());
    }
    let input = if v.inputs.iter().all(|i| matches!(i, Input::Text(_))) {
        EmbedInput::Texts(
            v.inputs
                .into_iter()
                .filter_map(|i| match i {
                    Input::Text(t) => Some(t),
                    Input::Ids(_) => None,
                })
                .collect(),
        )
    } else {
        EmbedInput::Ids(
            v.inputs
                .into_iter()
                .filter_map(|i| match i {
                    Input::Ids(ids) => Some(ids),
                    Input::Text(_) => None,
                })
                .collect(),
        )
    };
    let out = e
        .engine
        .embed(input)
        .await
        .map_err(|err| engine_failure(err, &state, "input"))?;
    let tokens: usize = out.iter().map(|(_, n)| n).sum();
    let data = out
        .into_iter()
        .enumerate()
        .map(|(index, (vector, _))| (index, shortened(vector, v.dimensions)))
        .map(|(index, vector)| EmbeddingObject {
            embedding: if v.base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                EmbeddingVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                EmbeddingVector::Float(vector)
            },
            index,
            object: "embedding",
        })
        .collect();
    Ok(Json(EmbeddingList {
        data,
        model: e.name.clone(),
        object: "list",
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    })
    .into_response())
}

/// The first `dims` values of `v`, scaled back to unit length (OpenAI's `dimensions`: only
/// models trained for it, Matryoshka-style, keep their quality when shortened); `v` itself
/// without `dims`.
fn shortened(mut v: Vec<f32>, dims: Option<usize>) -> Vec<f32> {
    let Some(d) = dims else {
        return v;
    };
    v.truncate(d);
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for x in &mut v {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
    v
}
