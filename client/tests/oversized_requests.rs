//! A request the daemon would refuse for its size is refused by the client
//! before a byte is sent: an identifier over 512 bytes is `field_too_long`,
//! a payload over 16 KiB `frame_too_large`. Sent, a frame larger than the
//! socket's buffer made the daemon close the connection mid-write, and the
//! failed write fell to the route's fail policy: a padded `client_id` was
//! let through a lockout on `login` (a red team's finding).

use tollgate_client::protocol::{ErrorCode, Outcome, Subject, IDENTIFIER_BYTES_MAX};
use tollgate_client::{Answer, Client, ClientConfig};

fn rejected_with(answer: &Answer, code: ErrorCode) -> bool {
    matches!(answer, Answer::Rejected(e) if e.code == code && e.message.contains("refused before sending"))
}

#[tokio::test]
async fn oversized_requests_are_rejected_without_reaching_for_the_socket() {
    // No daemon at all: a request that went out would be Unavailable.
    let dir = std::env::temp_dir().join(format!("tollgate-oversized-{}", std::process::id()));
    let client = std::sync::Arc::new(Client::new(ClientConfig::new(dir.join("nobody.sock"))));
    let padded = "x".repeat(300_000);
    let longest = "a".repeat(IDENTIFIER_BYTES_MAX);
    let peer = Some("198.51.100.7".parse().unwrap());
    for field in 0..4 {
        let mut subject = Subject { peer, account: Some("alice"), ..Subject::default() };
        let slot = [&mut subject.account, &mut subject.device, &mut subject.tenant, &mut subject.client_id];
        *slot.into_iter().nth(field).unwrap() = Some(&padded);
        let check = client.check("login", &subject).await;
        assert!(rejected_with(&check, ErrorCode::FieldTooLong), "field {field}: {check:?}");
        assert!(!check.proceeds());
        let report = client.report("login", &subject, Outcome::Failure).await;
        assert!(rejected_with(&report, ErrorCode::FieldTooLong), "field {field}: {report:?}");
        let abandon = client.abandon("login", &subject).await.answer;
        assert!(rejected_with(&abandon, ErrorCode::FieldTooLong), "field {field}: {abandon:?}");
        // The guard of a rejected check holds nothing, so sends nothing.
        let attempt = client.begin("login", &subject, None).await;
        assert!(!attempt.proceeds() && attempt.abandon().await.is_none());
    }
    // At the limit it goes out (and, with no daemon, fails open on login).
    let at_limit = Subject { peer, account: Some(&longest), client_id: Some(&longest), ..Subject::default() };
    assert!(matches!(client.check("login", &at_limit).await, Answer::Unavailable { .. }));
    // A route name past the frame's room.
    let route = "r".repeat(20_000);
    let subject = Subject { peer, account: Some("alice"), ..Subject::default() };
    let check = client.check(&route, &subject).await;
    assert!(rejected_with(&check, ErrorCode::FrameTooLarge), "{check:?}");
}
