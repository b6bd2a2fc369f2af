//! Answering a model's query over one user's index.

use nightmail_types::Address;
use tantivy::TantivyDocument;
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, Occur, Query, QueryParser, TermQuery};
use tantivy::schema::{Field, IndexRecordOption, Term, Value};
use tantivy::snippet::{Snippet, SnippetGenerator};

use crate::{IndexError, MailHit, MailIndex, UserIndex};

/// At most this many hits, whatever the caller asks: more would not fit a prompt anyway.
const MOST_HITS: usize = 100;
/// A snippet's length in characters.
const SNIPPET_CHARS: usize = 240;
/// A subject word says more about a message than a body word.
const SUBJECT_BOOST: f32 = 2.0;

impl MailIndex {
    /// The best `limit` messages of `user`'s own mail for `query`, best first.
    ///
    /// The query is read leniently, as a model writes it: words, `"phrases"`, `subject:`,
    /// `from:` and `body:` prefixes, AND/OR/NOT and `-word`; what cannot be read is dropped. A
    /// query of which nothing can be read is [`IndexError::Query`].
    pub fn search(&self, user: &Address, query: &str, limit: usize) -> Result<Vec<MailHit>, IndexError> {
        let index = self.user_index(user, false)?;
        let limit = limit.min(MOST_HITS);
        if limit == 0 {
            return Ok(Vec::new());
        }
        index.search(user, query, limit)
    }
}

impl UserIndex {
    fn search(&self, user: &Address, text: &str, limit: usize) -> Result<Vec<MailHit>, IndexError> {
        let f = &self.fields;
        let mut parser = QueryParser::for_index(&self.index, f.searched());
        parser.set_field_boost(f.subject, SUBJECT_BOOST);
        let unreadable = |reason: String| IndexError::Query { query: text.to_string(), reason };
        // tantivy's parser has panicked on odd input in past releases; a query is a model's text,
        // and must not take the worker down.
        let (parsed, errors) = std::panic::catch_unwind(|| parser.parse_query_lenient(text))
            .map_err(|_| unreadable("the query parser failed on it".into()))?;
        let mut terms = 0;
        parsed.query_terms(&mut |_, _| terms += 1);
        if terms == 0 {
            let reason = errors.first().map_or_else(|| "it has no words to search for".into(), |e| e.to_string());
            return Err(unreadable(reason));
        }
        if !errors.is_empty() {
            tracing::debug!(query = text, ?errors, "parts of a search_mail query were dropped");
        }
        // The second guard: even within the user's own directory, only their documents count.
        let owner = TermQuery::new(Term::from_field_text(f.user, user.as_str()), IndexRecordOption::Basic);
        let query = BooleanQuery::new(vec![(Occur::Must, parsed), (Occur::Must, Box::new(owner))]);

        // Sees what another handle or process committed since; cheap when nothing was.
        self.reader.reload().map_err(|e| self.error(e))?;
        let searcher = self.reader.searcher();
        let top = searcher.search(&query, &TopDocs::with_limit(limit).order_by_score()).map_err(|e| self.error(e))?;
        let mut snippets = SnippetGenerator::create(&searcher, &query, f.body).map_err(|e| self.error(e))?;
        snippets.set_max_num_chars(SNIPPET_CHARS);
        top.into_iter()
            .map(|(_, address)| {
                let doc: TantivyDocument = searcher.doc(address).map_err(|e| self.error(e))?;
                Ok(self.hit(&doc, &snippets))
            })
            .collect()
    }

    fn hit(&self, doc: &TantivyDocument, snippets: &SnippetGenerator) -> MailHit {
        let f = &self.fields;
        let text = |field: Field| doc.get_first(field).and_then(|v| v.as_str()).map(str::to_string);
        let snippet = snippets.snippet_from_doc(doc);
        let snippet = if snippet.is_empty() {
            // The words matched the subject or author only: the body's opening stands in.
            text(f.body).map(|b| opening(&b)).unwrap_or_default()
        } else {
            marked(&snippet)
        };
        MailHit {
            mailbox: text(f.mailbox).unwrap_or_default(),
            uid: doc.get_first(f.uid).and_then(|v| v.as_u64()).unwrap_or_default() as u32,
            date: text(f.date),
            from: text(f.from).unwrap_or_default(),
            subject: text(f.subject).unwrap_or_default(),
            snippet,
            message_id: text(f.message_id),
        }
    }
}

/// The fragment as plain text, each matched word between `**` (a model reads Markdown).
fn marked(snippet: &Snippet) -> String {
    let fragment = snippet.fragment();
    let mut out = String::with_capacity(fragment.len() + 16);
    let mut at = 0;
    for range in snippet.highlighted() {
        out.push_str(&fragment[at..range.start]);
        out.push_str("**");
        out.push_str(&fragment[range.clone()]);
        out.push_str("**");
        at = range.end;
    }
    out.push_str(&fragment[at..]);
    one_line(&out)
}

fn opening(body: &str) -> String {
    let cut: String = body.chars().take(SNIPPET_CHARS).collect();
    one_line(&cut)
}

/// Whitespace runs, newlines included, as one space: a hit is one line in a tool's answer.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use nightmail_types::Address;
    use tantivy::TantivyDocument;

    use crate::MailIndex;

    /// The user field is a guard of its own: a document of Bob's that somehow sat in Ann's
    /// directory is still not hers to find.
    #[test]
    fn a_document_of_another_user_in_ones_own_index_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let index = MailIndex::open(dir.path()).unwrap();
        let (ann, bob) = (Address::parse("ann@x.org").unwrap(), Address::parse("bob@x.org").unwrap());
        let own = index.user_index(&ann, true).unwrap();
        let mut writer = own.writer().unwrap();
        for (user, subject) in [(&ann, "mine"), (&bob, "stray")] {
            let mut doc = TantivyDocument::default();
            doc.add_text(own.fields.user, user.as_str());
            doc.add_text(own.fields.subject, subject);
            doc.add_text(own.fields.body, "kestrel");
            writer.add_document(doc).unwrap();
        }
        writer.commit().unwrap();
        own.reader.reload().unwrap();
        let hits = index.search(&ann, "kestrel", 10).unwrap();
        assert_eq!(hits.iter().map(|h| h.subject.as_str()).collect::<Vec<_>>(), ["mine"]);
    }
}
