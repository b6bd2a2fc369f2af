//! A research job's journal (`data_dir/checkpoints/job-ID.research`): each round the model wrote
//! calls in, and each call's result, appended and made durable before the next step, so a job
//! killed at any point resumes with the calls it made and the results it had: no fetch is repeated,
//! and the model reads the same results again.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::sources::Source;
use crate::backend::CallRequest;

/// What one call gave the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallOutcome {
    /// The tool turn's text, as the model reads it.
    pub text: String,
    /// What the text cites, numbered in the order the job first saw them.
    pub sources: Vec<Source>,
    /// Bytes downloaded for it.
    pub bytes: u64,
    /// Milliseconds it took.
    pub millis: u64,
    /// Whether the tool ran (an error or a refused call: false).
    pub ran: bool,
}

impl CallOutcome {
    /// A tool's result, to be filled in: what it found and what it cost.
    pub fn ran(text: String) -> CallOutcome {
        CallOutcome { text, sources: Vec::new(), bytes: 0, millis: 0, ran: true }
    }

    /// A call that did not run, told why.
    pub fn failed(text: String) -> CallOutcome {
        CallOutcome { ran: false, ..CallOutcome::ran(text) }
    }
}

/// A round: what the model wrote, with its calls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Round {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<CallRequest>,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "snake_case")]
enum Entry {
    Round { round: u32, written: Round },
    Result { round: u32, call: String, outcome: CallOutcome },
}

/// The journal of one job, with what it held when opened.
pub struct Journal {
    path: PathBuf,
    rounds: Vec<Round>,
    results: HashMap<(u32, String), CallOutcome>,
}

impl Journal {
    pub fn path(checkpoints: &Path, job: u64) -> PathBuf {
        checkpoints.join(format!("job-{job}.research"))
    }

    /// Opens a job's journal, reading what an earlier attempt wrote. A line cut short by a crash
    /// (the last one) is dropped: what it recorded is done again.
    pub fn open(path: PathBuf) -> std::io::Result<Journal> {
        let mut journal = Journal { path, rounds: Vec::new(), results: HashMap::new() };
        let file = match File::open(&journal.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(journal),
            Err(e) => return Err(e),
        };
        for line in BufReader::new(file).lines() {
            let Ok(entry) = serde_json::from_str::<Entry>(&line?) else { break };
            match entry {
                Entry::Round { round, written } if round as usize == journal.rounds.len() => {
                    journal.rounds.push(written)
                }
                Entry::Round { .. } => break,
                Entry::Result { round, call, outcome } => {
                    journal.results.insert((round, call), outcome);
                }
            }
        }
        Ok(journal)
    }

    /// The round `round` as an earlier attempt recorded it.
    pub fn round(&self, round: u32) -> Option<&Round> {
        self.rounds.get(round as usize)
    }

    pub fn result(&self, round: u32, call: &str) -> Option<&CallOutcome> {
        self.results.get(&(round, call.to_string()))
    }

    pub fn record_round(&mut self, round: u32, written: Round) -> std::io::Result<()> {
        self.append(&Entry::Round { round, written: written.clone() })?;
        self.rounds.push(written);
        Ok(())
    }

    pub fn record_result(&mut self, round: u32, call: &str, outcome: CallOutcome) -> std::io::Result<()> {
        self.append(&Entry::Result { round, call: call.to_string(), outcome: outcome.clone() })?;
        self.results.insert((round, call.to_string()), outcome);
        Ok(())
    }

    /// A failure to write the journal, as the store's I/O errors are told.
    pub fn error(&self, e: std::io::Error) -> nightmail_store::StoreError {
        nightmail_store::StoreError::Io { path: self.path.clone(), message: format!("the research journal: {e}") }
    }

    /// One line, on disk before this returns (a crash after it keeps it).
    fn append(&self, entry: &Entry) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut line = serde_json::to_string(entry).map_err(std::io::Error::other)?;
        line.push('\n');
        let mut file = OpenOptions::new().create(true).append(true).open(&self.path)?;
        file.write_all(line.as_bytes())?;
        file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> CallRequest {
        CallRequest { id: id.into(), name: "fetch".into(), arguments: r#"{"url":"http://x/"}"#.into(), malformed: None }
    }

    fn outcome(text: &str) -> CallOutcome {
        CallOutcome { text: text.into(), sources: Vec::new(), bytes: 10, millis: 1, ran: true }
    }

    #[test]
    fn rounds_and_results_survive_a_reopen_and_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = Journal::path(dir.path(), 7);
        let mut j = Journal::open(path.clone()).unwrap();
        let round = Round {
            content: String::new(),
            reasoning: "r".into(),
            calls: vec![call("a")],
            output_tokens: 3,
            reasoning_tokens: 1,
        };
        j.record_round(0, round.clone()).unwrap();
        j.record_result(0, "a", outcome("page")).unwrap();
        // A crash in the middle of writing the next line.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"entry\":\"round\",\"rou").unwrap();
        let j = Journal::open(path).unwrap();
        assert_eq!(j.round(0), Some(&round));
        assert_eq!(j.round(1), None);
        assert_eq!(j.result(0, "a"), Some(&outcome("page")));
        assert_eq!(j.result(0, "b"), None);
    }
}
