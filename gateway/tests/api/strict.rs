//! Strict framing: a bare LF never ends a line of a request head or a chunked body's
//! trailers.

use crate::helpers::user_token;
use crate::raw::{RawClient, gateway_with};

/// A request smuggled behind an ambiguous one.
const SMUGGLED: &str = "GET /admin/products HTTP/1.1\r\nhost: x\r\n\r\n";

#[tokio::test]
async fn a_bare_lf_in_a_request_head_is_refused_with_400_and_the_connection_closed() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let auth = format!("authorization: Bearer {}", user_token(112));
    for head in [
        format!("GET /api/products/1 HTTP/1.1\nhost: x\r\n{auth}\r\n\r\n"),
        format!("GET /api/products/1 HTTP/1.1\r\nhost: x\n{auth}\r\n\r\n"),
        format!("GET /api/products/1 HTTP/1.1\r\nhost: x\r\n{auth}\n\n"),
        format!("GET /api/products/1 HTTP/1.1\r\nhost: x\r\n{auth}\r\n\n{SMUGGLED}"),
    ] {
        let mut client = RawClient::connect(&gateway).await;
        client.send(&head).await;
        assert_eq!(client.last_answer().await.status, 400, "{head:?}");
    }
    assert!(replica.seen().is_empty(), "{:?}", replica.seen());
}

#[tokio::test]
async fn trailers_must_be_header_lines_ended_by_crlf() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let auth = format!("authorization: Bearer {}\r\n", user_token(113));
    for trailers in [
        "x-t: 1\n\r\n",
        "x-t: 1\r\n\n",
        "\n",
        "bad trailer: 1\r\n\r\n",
        "no-colon\r\n\r\n",
    ] {
        let mut client = RawClient::connect(&gateway).await;
        client
            .send(format!(
                "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\n{auth}transfer-encoding: chunked\r\n\r\n\
                 2\r\n{{}}\r\n0\r\n{trailers}{SMUGGLED}"
            ))
            .await;
        assert_eq!(client.last_answer().await.status, 400, "{trailers:?}");
    }
    assert!(replica.seen().is_empty(), "{:?}", replica.seen());
    let mut fine = RawClient::connect(&gateway).await;
    fine.send(format!(
        "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\n{auth}transfer-encoding: chunked\r\n\r\n\
         2\r\n{{}}\r\n0\r\nx-t: 1\r\nx-u: 2\r\n\r\n"
    ))
    .await;
    let answer = fine.answer().await;
    assert_eq!(answer.status, 200);
    assert!(!answer.closes());
    let seen = replica.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-t"), None, "trailers are dropped");
}
