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
use crate::api::{parse_body, EmbeddingRequest, Input};
use crate::engine::EmbedInput;
use crate::responses::{EmbeddingList, EmbeddingObject, EmbeddingUsage, EmbeddingVector};

pub(super) async fn embeddings(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Failure> {
    let req: EmbeddingRequest = parse_body(&body_bytes(body)?)?;
    let e = state.embedder(&req.model)?;
    let v = req.validate(state.max_embed_inputs)?;
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
        .map(|(index, (vector, _))| EmbeddingObject {
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
