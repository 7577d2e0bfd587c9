//! What a route answers: status, content type, body (the routes of `http.rs` and the API of
//! `api.rs` make them).

use hyper::body::Bytes;

/// A response: status, content type, body.
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Bytes,
}

impl Reply {
    /// A JSON reply.
    pub fn json(status: u16, body: impl Into<Bytes>) -> Self {
        Reply { status, content_type: "application/json", body: body.into() }
    }

    /// An error as `{"error": message}`.
    pub fn error(status: u16, message: impl std::fmt::Display) -> Self {
        Reply::json(status, serde_json::json!({ "error": message.to_string() }).to_string())
    }
}
