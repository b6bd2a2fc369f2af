//! The fields of a user's mail index, and the tokenizer its text fields share.

use tantivy::Index;
use tantivy::schema::{Field, INDEXED, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions};
use tantivy::tokenizer::{AsciiFoldingFilter, LowerCaser, RemoveLongFilter, SimpleTokenizer, TextAnalyzer};

/// Bumped whenever a field or the tokenizer changes: an index written under another version is
/// thrown away and rebuilt from the store (it holds nothing the store does not).
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// The tokenizer of subject, from and body. Folding to ASCII lets a model's `cafe` find `café`
/// (and the reverse); no stemming, so a quoted phrase matches the words as written.
const MAIL_TOKENIZER: &str = "mail";

/// Tokens longer than this are not indexed: base64 runs and URLs of inline data, not words.
const LONGEST_TOKEN: usize = 64;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Fields {
    /// The owner's address, raw: the second guard on a search, after the directory itself.
    pub user: Field,
    /// The store's mailbox id: a mailbox re-indexed or gone is deleted by this term.
    pub mailbox_id: Field,
    /// `mailbox_id:uid`: an expunged message is deleted by this term.
    pub doc_key: Field,
    pub mailbox: Field,
    pub uid: Field,
    pub subject: Field,
    pub from: Field,
    pub body: Field,
    pub date: Field,
    pub message_id: Field,
}

impl Fields {
    pub(crate) fn schema() -> (Schema, Fields) {
        let mut b = Schema::builder();
        let text = TextOptions::default()
            .set_indexing_options(
                TextFieldIndexing::default()
                    .set_tokenizer(MAIL_TOKENIZER)
                    .set_index_option(IndexRecordOption::WithFreqsAndPositions),
            )
            .set_stored();
        let fields = Fields {
            user: b.add_text_field("user", STRING),
            mailbox_id: b.add_u64_field("mailbox_id", INDEXED),
            doc_key: b.add_text_field("doc_key", STRING),
            mailbox: b.add_text_field("mailbox", STORED),
            uid: b.add_u64_field("uid", STORED),
            subject: b.add_text_field("subject", text.clone()),
            from: b.add_text_field("from", text.clone()),
            body: b.add_text_field("body", text),
            date: b.add_text_field("date", STORED),
            message_id: b.add_text_field("message_id", STORED),
        };
        (b.build(), fields)
    }

    /// The fields of an index opened from disk, found by name; `None` if one is missing (an
    /// index from another version).
    pub(crate) fn of(schema: &Schema) -> Option<Fields> {
        let f = |name: &str| schema.get_field(name).ok();
        Some(Fields {
            user: f("user")?,
            mailbox_id: f("mailbox_id")?,
            doc_key: f("doc_key")?,
            mailbox: f("mailbox")?,
            uid: f("uid")?,
            subject: f("subject")?,
            from: f("from")?,
            body: f("body")?,
            date: f("date")?,
            message_id: f("message_id")?,
        })
    }

    /// The fields a model's query searches without a `field:` prefix.
    pub(crate) fn searched(&self) -> Vec<Field> {
        vec![self.subject, self.from, self.body]
    }
}

pub(crate) fn doc_key(mailbox_id: u64, uid: u32) -> String {
    format!("{mailbox_id}:{uid}")
}

/// Tokenizers are not saved with an index: every open registers ours again.
pub(crate) fn register_tokenizer(index: &Index) {
    let analyzer = TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(LONGEST_TOKEN))
        .filter(LowerCaser)
        .filter(AsciiFoldingFilter)
        .build();
    index.tokenizers().register(MAIL_TOKENIZER, analyzer);
}
