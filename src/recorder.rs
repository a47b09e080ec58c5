//! Placeholder for the `metrics` facade (replaced by the metrics work).
#![allow(dead_code)]

use std::time::Duration;

use crate::attempt::Outcome;

#[inline]
pub(crate) fn describe() {}

#[inline]
pub(crate) fn request_finished(
    _route: Option<&str>,
    _method: &http::Method,
    _outcome: Outcome,
    _error_type: Option<&str>,
    _attempts: u32,
    _backoff: Duration,
) {
}

#[inline]
pub(crate) fn replay(_route: Option<&str>, _method: &http::Method, _error_type: &str) {}

#[inline]
pub(crate) fn queue_wait(_route: Option<&str>, _method: &http::Method, _waited: Duration) {}

#[inline]
pub(crate) fn buffered_bytes(_delta: isize) {}
