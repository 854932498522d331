//! What the fuzz targets (`fuzz/`) need that the crate keeps to itself: the client's
//! reading of an upstream response head. Hidden from the docs and not for the application:
//! the request head parser and the chunked decoder are public already.

use crate::client;

/// A response head as the client read it (see [`parse_response_head`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHeadView {
    /// Bytes the head took, status line to the empty line.
    pub length: usize,
    /// The status code.
    pub status: u16,
    /// The end-to-end header lines the client keeps, as they are written on.
    pub lines: Vec<u8>,
    /// Whether the response has no body, whatever its head says.
    pub bodiless: bool,
    /// A `Transfer-Encoding` was sent; whether its last coding is `chunked`.
    pub transfer_encoding: Option<bool>,
    /// A `Content-Length` was sent: its value, `None` when malformed or conflicting.
    pub content_length: Option<Option<u64>>,
    /// Whether the connection may carry another request.
    pub keep_alive: bool,
}

/// The response head at the start of `buffer` as the client reads it; `Ok(None)` while it
/// is incomplete, the reason when it is refused. `head_only`: the request was a `HEAD`.
pub fn parse_response_head(
    buffer: &[u8],
    head_only: bool,
) -> Result<Option<ResponseHeadView>, String> {
    let parsed = client::parse_response_head(buffer, head_only).map_err(|e| e.to_string())?;
    Ok(parsed.map(|(length, head)| ResponseHeadView {
        length,
        status: head.status,
        lines: head.lines,
        bodiless: head.bodiless,
        transfer_encoding: head.framing.transfer_encoding,
        content_length: head.framing.content_length,
        keep_alive: head.framing.keep_alive,
    }))
}
