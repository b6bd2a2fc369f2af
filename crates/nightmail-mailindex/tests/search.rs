//! Searching: only the asking user's mail, whatever the query.

mod common;

use common::World;
use nightmail_mailindex::IndexError;

/// Bob's message matches Ann's query better (every word, twice), and still never reaches her.
#[tokio::test]
async fn a_user_finds_only_their_own_mail_even_when_another_matches_better() {
    let w = World::new().await;
    w.deliver(&w.ann, "Quarterly plans", "the budget is tight this quarter").await;
    w.deliver(&w.bob, "Budget budget report", "budget report budget report: secret numbers").await;
    w.index.catch_up(&w.store, &w.ann).unwrap();
    w.index.catch_up(&w.store, &w.bob).unwrap();

    let hits = w.index.search(&w.ann, "budget report", 10).unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].subject, "Quarterly plans");
    assert!(hits.iter().all(|h| !h.subject.contains("report") && !h.snippet.contains("secret")), "{hits:?}");
    assert!(w.subjects(&w.ann, "secret").is_empty(), "Bob's word found in Ann's index");
    assert_eq!(w.subjects(&w.bob, "secret"), ["Budget budget report"]);

    // Bob's index is another directory, named by the digest of his address.
    assert_ne!(w.index.user_dir(&w.ann), w.index.user_dir(&w.bob));
    assert!(w.index.user_dir(&w.ann).starts_with(w.dir.path().join("mail_index")));
    // It holds the mail's text: nobody but the daemon's user may enter it.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(w.dir.path().join("mail_index")).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "mode {mode:o}");
}

#[tokio::test]
async fn a_hit_names_its_message_and_marks_the_matched_words() {
    let w = World::new().await;
    let uid = w.deliver(&w.ann, "Trip", "We land in Lisbon on Friday morning.\r\nSee you there.").await;
    w.index.catch_up(&w.store, &w.ann).unwrap();
    let hit = w.index.search(&w.ann, "lisbon", 5).unwrap().remove(0);
    assert_eq!((hit.mailbox.as_str(), hit.uid, hit.subject.as_str()), ("INBOX", uid, "Trip"));
    assert_eq!(hit.from, "Sender <sender@example.org>");
    assert!(hit.date.as_deref().unwrap().contains("2025"), "{hit:?}");
    assert!(hit.message_id.as_deref().unwrap().ends_with("@test>"), "{hit:?}");
    assert!(hit.snippet.contains("**Lisbon**") && !hit.snippet.contains('\n'), "{}", hit.snippet);
    // The worker journals hits.
    let json = serde_json::to_string(&hit).unwrap();
    assert_eq!(serde_json::from_str::<nightmail_mailindex::MailHit>(&json).unwrap(), hit);
}

#[tokio::test]
async fn unicode_quotes_and_fields_in_a_query() {
    let w = World::new().await;
    w.deliver(&w.ann, "Café Zürich", "Rendez-vous au café près de la gare, 東京 is next").await;
    w.deliver(&w.ann, "Other", "the gare is closed; meet at the café instead").await;
    w.index.catch_up(&w.store, &w.ann).unwrap();

    assert_eq!(w.subjects(&w.ann, "zürich"), ["Café Zürich"]);
    assert_eq!(w.subjects(&w.ann, "zurich"), ["Café Zürich"], "accents fold");
    assert_eq!(w.subjects(&w.ann, "東京"), ["Café Zürich"]);
    assert_eq!(w.subjects(&w.ann, "\"café près\""), ["Café Zürich"], "a phrase");
    assert_eq!(w.subjects(&w.ann, "subject:other"), ["Other"]);
    assert_eq!(w.subjects(&w.ann, "from:sender gare -zurich"), ["Other"]);
    assert_eq!(w.subjects(&w.ann, "“café” ‘gare’").len(), 2, "curly quotes are punctuation");
    assert!(w.subjects(&w.ann, "nowhere").is_empty());
}

/// A model's malformed query gives hits or a readable error, never a panic.
#[tokio::test]
async fn malformed_queries_give_hits_or_an_error() {
    let w = World::new().await;
    w.deliver(&w.ann, "Plans", "unclosed plans and more").await;
    w.index.catch_up(&w.store, &w.ann).unwrap();
    for query in [
        "\"unclosed",
        "AND OR",
        "subject:",
        "(plans",
        "plans)",
        "nofield:plans",
        "plans^^",
        "*",
        "\"\"",
        "",
        "   ",
        ":::",
        "subject:\"",
        "[a TO",
        "-",
        "+plans -",
        "plans~",
        "\\",
        "\u{0}",
    ] {
        match w.index.search(&w.ann, query, 5) {
            Ok(hits) => assert!(hits.iter().all(|h| h.subject == "Plans"), "{query}: {hits:?}"),
            Err(e @ IndexError::Query { .. }) => assert!(e.to_string().contains("quoted phrase"), "{query}: {e}"),
            Err(other) => panic!("{query}: {other}"),
        }
    }
    assert_eq!(w.subjects(&w.ann, "\"unclosed"), ["Plans"], "an unclosed quote still searches its word");
    assert!(w.index.search(&w.ann, "plans", 0).unwrap().is_empty());
}

#[tokio::test]
async fn a_user_not_configured_or_not_indexed_is_told_so() {
    let w = World::new().await;
    let eve = common::addr("eve@nightmail.local");
    assert!(matches!(w.index.catch_up(&w.store, &eve), Err(IndexError::UnknownUser { .. })));
    let error = w.index.search(&w.ann, "x", 5).unwrap_err();
    assert!(matches!(error, IndexError::NotIndexed { .. }), "{error}");
    assert!(error.to_string().contains("catch_up"), "{error}");
}
