//! Decoding script replies: integers, strings, per-item codes.

use redis::Value;

use crate::error::{Error, Result, ScriptCode};

pub(super) fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(Error::Protocol(format!("expected an integer from a script, got {other:?}"))),
    }
}

pub(super) fn string(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|e| Error::Protocol(e.to_string())),
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(Error::Protocol(format!("expected a string from a script, got {other:?}"))),
    }
}

/// Per-item result codes of the batch scripts: `Ok(n)` with n ≥ 0, or the refusal.
pub type ItemCodes = Vec<std::result::Result<i64, ScriptCode>>;

pub(super) fn codes(v: Vec<i64>) -> ItemCodes {
    v.into_iter()
        .map(|c| match ScriptCode::from_code(c) {
            None => Ok(c),
            Some(e) => Err(e),
        })
        .collect()
}

pub(super) fn code_result(code: i64) -> Result<i64> {
    match ScriptCode::from_code(code) {
        None => Ok(code),
        Some(c) => Err(Error::Script(c)),
    }
}
