//! `search_mail`: the asking user's own mail, through their index (caught up with the store first,
//! so mail that came in tonight is found). Only the asker's index is ever opened for a job.

use nightmail_mailindex::{MailHit, MailIndex};
use nightmail_store::Store;
use nightmail_types::Address;

use super::journal::CallOutcome;
use super::sources::{Source, Sources};

/// Messages given to the model per search.
const HITS: usize = 8;

/// The mail one job may search: its asker's.
pub struct MailSearch {
    index: MailIndex,
    store: Store,
    asker: Address,
}

impl MailSearch {
    pub fn new(index: MailIndex, store: Store, asker: Address) -> MailSearch {
        MailSearch { index, store, asker }
    }

    /// The hits for `query`, numbered as sources (the toolbox cuts the text to its result limit).
    pub async fn search(&self, query: &str, sources: &mut Sources) -> CallOutcome {
        let (index, store, asker, query) =
            (self.index.clone(), self.store.clone(), self.asker.clone(), query.to_string());
        let found = tokio::task::spawn_blocking(move || {
            index.catch_up(&store, &asker)?;
            index.search(&asker, &query, HITS)
        })
        .await;
        let hits = match found {
            Ok(Ok(hits)) => hits,
            Ok(Err(e)) => return CallOutcome::failed(format!("error: the mail search failed: {e}")),
            Err(e) => return CallOutcome::failed(format!("error: the mail search failed: {e}")),
        };
        if hits.is_empty() {
            return CallOutcome::ran("No messages found.".into());
        }
        let mut text = String::new();
        let mut cited = Vec::new();
        for hit in &hits {
            let source = source(hit);
            let n = sources.number(&source);
            cited.push(source);
            text.push_str(&format!(
                "[{n}] {}, from {}, \"{}\" (in {})\n{}\n\n",
                hit.date.as_deref().unwrap_or("undated"),
                hit.from,
                hit.subject,
                hit.mailbox,
                hit.snippet.trim()
            ));
        }
        CallOutcome { sources: cited, ..CallOutcome::ran(text) }
    }
}

fn source(hit: &MailHit) -> Source {
    Source::Mail {
        date: hit.date.clone().unwrap_or_else(|| "undated".into()),
        from: hit.from.clone(),
        subject: hit.subject.clone(),
    }
}
