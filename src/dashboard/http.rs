//! Requests and responses: routing by method and path, the headers every response carries, the
//! token check of actions, the query string.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};

use super::api;
use super::reply::Reply;
use super::settings::Dashboard;

/// Every response's policy: nothing but this server's own script, style and API.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                       img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// How long a client may take to send a request's head (also while a kept-alive connection
/// waits for its next request).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection lives; a browser opens a new one transparently.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);

/// Serves one connection (HTTP/1.1, keep-alive) until the peer closes it, it idles past
/// [`HEADER_TIMEOUT`], or it reaches [`CONNECTION_LIFETIME`].
pub async fn connection(stream: tokio::net::TcpStream, dashboard: Arc<Dashboard>) {
    let io = hyper_util::rt::TokioIo::new(stream);
    let service = hyper::service::service_fn(move |req| {
        let d = dashboard.clone();
        async move { Ok::<_, Infallible>(respond(&d, req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(io, service);
    // past its lifetime the connection is dropped (closed) with its pending request
    if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_LIFETIME, served).await {
        tracing::debug!("dashboard connection: {e}");
    }
}

async fn respond(d: &Dashboard, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = route(d, &req).await;
    let mut res = Response::new(Full::new(reply.body));
    *res.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = res.headers_mut();
    h.insert("content-type", HeaderValue::from_static(reply.content_type));
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    res
}

async fn route(d: &Dashboard, req: &Request<Incoming>) -> Reply {
    // a page served on loopback answers only to loopback names: a rebinding DNS name pointing
    // at 127.0.0.1 cannot read it from a browser
    if let Some(allowed) = &d.hosts {
        let host = req.headers().get("host").and_then(|v| v.to_str().ok()).unwrap_or("");
        if !allowed.iter().any(|h| h == host) {
            return Reply::error(421, format!("this dashboard answers to {} only", allowed.join(", ")));
        }
    }
    let path = req.uri().path();
    let query = match parse_query(req.uri().query().unwrap_or("")) {
        Ok(q) => q,
        Err(e) => return Reply::error(400, e),
    };
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (req.method(), parts.as_slice()) {
        (&Method::GET, [""]) => Reply { status: 200, content_type: "text/html; charset=utf-8", body: INDEX.into() },
        (&Method::GET, ["app.js"]) => {
            Reply { status: 200, content_type: "text/javascript; charset=utf-8", body: SCRIPT.into() }
        }
        (&Method::GET, ["app.css"]) => {
            Reply { status: 200, content_type: "text/css; charset=utf-8", body: STYLE.into() }
        }
        (&Method::GET, ["api", "info"]) => Reply::json(200, api::info(d).to_string()),
        (&Method::GET, ["api", rest @ ..]) => {
            let allowed = api::params(rest);
            if let Some(k) = query.keys().find(|k| !allowed.contains(&k.as_str())) {
                return Reply::error(
                    400,
                    format!("unknown query parameter '{k}' (this endpoint takes: {})", allowed.join(", ")),
                );
            }
            // one computation per request key and second, shared by every viewer
            let key = match req.uri().query() {
                Some(q) => format!("{path}?{q}"),
                None => path.to_owned(),
            };
            let (status, body) = d.reads.get(&key, || api::read(d, rest, &query)).await;
            Reply::json(status, body)
        }
        (&Method::POST, ["api", rest @ ..]) => {
            if let Err(r) = authorize(d, req) {
                return r;
            }
            api::act(d, rest, &query).await
        }
        (_, ["api", ..]) => Reply::error(405, "the API takes GET for reads and POST for actions"),
        (&Method::GET, _) => Reply::error(404, format!("no page {path}")),
        _ => Reply::error(405, "method not allowed"),
    }
}

/// Whether `req` may act: a token is configured, the `Authorization: Bearer` header carries it,
/// and a browser's `Origin`, when sent, is this server.
fn authorize(d: &Dashboard, req: &Request<Incoming>) -> Result<(), Reply> {
    let Some(token) = &d.token else {
        return Err(Reply::error(
            403,
            "the dashboard is read-only: start the coordinator with --ui-token-file FILE to allow actions",
        ));
    };
    let given =
        req.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if !given.is_some_and(|g| same(g.as_bytes(), token.as_bytes())) {
        return Err(Reply::error(401, "a valid token is required (header Authorization: Bearer TOKEN)"));
    }
    if let Some(origin) = req.headers().get("origin").and_then(|v| v.to_str().ok()) {
        let host = req.headers().get("host").and_then(|v| v.to_str().ok()).unwrap_or("");
        let origin_host = origin.split("://").nth(1).unwrap_or("");
        if origin_host != host {
            return Err(Reply::error(403, format!("requests from origin {origin} are not accepted")));
        }
    }
    Ok(())
}

/// Compares in time independent of where the two differ (and of the token's length: the
/// given value is compared against the token's length, padded).
fn same(given: &[u8], token: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != token.len());
    for (i, t) in token.iter().enumerate() {
        diff |= given.get(i).copied().unwrap_or(0) ^ t;
    }
    diff == 0
}

/// `k=v&k=v`: the API's values are names, numbers and cursors, never encoded; anything that
/// needs decoding is refused rather than guessed.
fn parse_query(q: &str) -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let ok = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok(k) || !ok(v) {
            return Err(format!("bad query parameter '{pair}': names and values are A-Z a-z 0-9 . _ -"));
        }
        if out.insert(k.to_owned(), v.to_owned()).is_some() {
            return Err(format!("query parameter '{k}' given twice"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_names_and_numbers_only() {
        let q = parse_query("state=failed&offset=20").unwrap();
        assert_eq!((q["state"].as_str(), q["offset"].as_str()), ("failed", "20"));
        assert!(parse_query("state=%3Cscript%3E").is_err());
        assert!(parse_query("a=1&a=2").is_err());
        assert!(parse_query("").unwrap().is_empty());
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcdeF"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcde"));
    }
}
