//! THREAD and UID THREAD (RFC 5256 §4) over the messages SEARCH would find. REFERENCES (after
//! Jamie Zawinski's algorithm): linked by Message-ID, References and In-Reply-To, empty
//! containers pruned, threads sorted by sent date and those with the same base subject gathered.
//! ORDEREDSUBJECT: grouped by base subject, each group's first message (by sent date) the parent
//! of the others.

use std::collections::HashMap;
use std::num::NonZeroU32;

use imap_next::imap_types::core::{Charset, Vec1, Vec2};
use imap_next::imap_types::extensions::thread::{Thread, ThreadingAlgorithm};
use imap_next::imap_types::response::Data;
use imap_next::imap_types::search::SearchKey;

use super::Done;
use super::search::{check_charset, matching, number};
use super::sort::keys_of;
use crate::ImapError;
use crate::order::Keys;
use crate::session::Session;

/// A message, or a dummy standing for one that was referred to but is not here.
struct Message {
    number: NonZeroU32,
    /// Position in the mailbox: the tie-break of equal dates (§2.2).
    index: usize,
    keys: Keys,
}

#[derive(Default)]
struct Node {
    message: Option<Message>,
    parent: Option<usize>,
    children: Vec<usize>,
}

#[derive(Default)]
struct Forest {
    nodes: Vec<Node>,
}

impl Forest {
    fn add(&mut self) -> usize {
        self.nodes.push(Node::default());
        self.nodes.len() - 1
    }

    /// Whether `ancestor` is `node` or above it.
    fn is_above(&self, ancestor: usize, node: usize) -> bool {
        let mut at = Some(node);
        while let Some(n) = at {
            if n == ancestor {
                return true;
            }
            at = self.nodes[n].parent;
        }
        false
    }

    fn unlink(&mut self, child: usize) {
        if let Some(parent) = self.nodes[child].parent.take() {
            self.nodes[parent].children.retain(|&c| c != child);
        }
    }

    /// Makes `child` a child of `parent`, unless that would make a loop.
    fn link(&mut self, parent: usize, child: usize) -> bool {
        if self.is_above(child, parent) {
            return false;
        }
        self.unlink(child);
        self.nodes[child].parent = Some(parent);
        self.nodes[parent].children.push(child);
        true
    }

    /// Step 4: dummies without children go; a dummy's children take its place, except under the
    /// root where a dummy with several children stays.
    fn prune(&mut self, level: Vec<usize>, root: bool) -> Vec<usize> {
        let mut out = Vec::new();
        for n in level {
            let children = std::mem::take(&mut self.nodes[n].children);
            let children = self.prune(children, false);
            if self.nodes[n].message.is_none() && (children.is_empty() || !root || children.len() == 1) {
                for &c in &children {
                    self.nodes[c].parent = None;
                }
                out.extend(children);
                continue;
            }
            for &c in &children {
                self.nodes[c].parent = Some(n);
            }
            self.nodes[n].children = children;
            out.push(n);
        }
        out
    }

    /// The message that dates and names `n`: itself, or a dummy's first child (§4 steps 4, 5).
    fn representative(&self, n: usize) -> Option<&Message> {
        match &self.nodes[n].message {
            Some(m) => Some(m),
            None => self.nodes[n].children.first().and_then(|&c| self.representative(c)),
        }
    }

    fn date_key(&self, n: usize) -> (i64, usize) {
        self.representative(n).map_or((i64::MAX, usize::MAX), |m| (m.keys.sent, m.index))
    }

    /// Step 6: every set of siblings by sent date, children before their parents.
    fn sort_children(&mut self, n: usize) {
        let mut children = std::mem::take(&mut self.nodes[n].children);
        for &c in &children {
            self.sort_children(c);
        }
        children.sort_by_key(|&c| self.date_key(c));
        self.nodes[n].children = children;
    }

    fn sort_level(&mut self, level: &mut [usize]) {
        for &n in level.iter() {
            self.sort_children(n);
        }
        level.sort_by_key(|&n| self.date_key(n));
    }

    /// Step 5: top-level threads with the same base subject are gathered.
    fn gather_by_subject(&mut self, roots: Vec<usize>) -> Vec<usize> {
        let subject = |f: &Forest, n: usize| f.representative(n).map(|m| m.keys.subject.clone()).unwrap_or_default();
        let reply = |f: &Forest, n: usize| f.nodes[n].message.as_ref().is_some_and(|m| m.keys.reply);
        let dummy = |f: &Forest, n: usize| f.nodes[n].message.is_none();
        let mut table: HashMap<String, usize> = HashMap::new();
        for &n in &roots {
            let s = subject(self, n);
            if s.is_empty() {
                continue;
            }
            match table.get(&s) {
                None => {
                    table.insert(s, n);
                }
                Some(&old) => {
                    // §4 step 5B: a dummy, or a message that is not a reply, is the better entry.
                    if !dummy(self, old) && (dummy(self, n) || (reply(self, old) && !reply(self, n))) {
                        table.insert(s, n);
                    }
                }
            }
        }
        let mut out = Vec::new();
        // Where a root went: a new dummy may stand in for the table's entry.
        let mut replaced: HashMap<usize, usize> = HashMap::new();
        for &n in &roots {
            let s = subject(self, n);
            let Some(&first) = table.get(&s).filter(|_| !s.is_empty()) else {
                out.push(n);
                continue;
            };
            if first == n {
                out.push(*replaced.get(&n).unwrap_or(&n));
                continue;
            }
            let target = *replaced.get(&first).unwrap_or(&first);
            if dummy(self, n) && dummy(self, target) {
                for c in std::mem::take(&mut self.nodes[n].children) {
                    self.nodes[c].parent = None;
                    self.link(target, c);
                }
            } else if (dummy(self, target) && !dummy(self, n))
                || (!dummy(self, target) && reply(self, n) && !reply(self, target))
            {
                // §4 step 5C: under the dummy, or a reply under the message it replies to.
                self.link(target, n);
            } else {
                let merged = self.add();
                self.link(merged, target);
                self.link(merged, n);
                replaced.insert(first, merged);
                if let Some(slot) = out.iter_mut().find(|slot| **slot == target) {
                    *slot = merged;
                }
            }
        }
        out
    }

    /// The wire form of the thread under `n` (RFC 5256 §4 thread-list): a chain of only children
    /// is one prefix, siblings are parenthesised answers.
    fn thread(&self, n: usize) -> Option<Thread> {
        let Some(message) = &self.nodes[n].message else {
            let answers: Vec<Thread> = self.nodes[n].children.iter().filter_map(|&c| self.thread(c)).collect();
            return match answers.len() {
                0 => None,
                1 => answers.into_iter().next(),
                _ => Vec2::try_from(answers).ok().map(|answers| Thread::Nested { answers }),
            };
        };
        let mut prefix = vec![message.number];
        let mut at = n;
        loop {
            let children = &self.nodes[at].children;
            match children.as_slice() {
                [only] if self.nodes[*only].message.is_some() => {
                    prefix.push(self.nodes[*only].message.as_ref().expect("checked").number);
                    at = *only;
                }
                _ => break,
            }
        }
        let answers: Vec<Thread> = self.nodes[at].children.iter().filter_map(|&c| self.thread(c)).collect();
        let prefix = Vec1::try_from(prefix).expect("one number at least");
        Some(match answers.len() {
            0 => Thread::Members { prefix, answers: None },
            1 => match answers.into_iter().next().expect("one") {
                Thread::Members { prefix: more, answers } => {
                    let mut all = prefix.into_inner();
                    all.extend(more.into_inner());
                    Thread::Members { prefix: Vec1::try_from(all).expect("non-empty"), answers }
                }
                Thread::Nested { answers } => Thread::Members { prefix, answers: Some(answers) },
            },
            _ => Thread::Members { prefix, answers: Vec2::try_from(answers).ok() },
        })
    }
}

/// RFC 5256 §4 ORDEREDSUBJECT over `messages`: sorted by base subject then sent date (ties by
/// mailbox order), one thread per base subject whose first message is the parent of the rest,
/// threads ordered by the sent date of their first message.
fn ordered_subject(mut messages: Vec<Message>) -> Vec<Thread> {
    messages.sort_by(|a, b| {
        (a.keys.subject.as_str(), a.keys.sent, a.index).cmp(&(b.keys.subject.as_str(), b.keys.sent, b.index))
    });
    let mut forest = Forest::default();
    let mut roots: Vec<usize> = Vec::new();
    let mut subject: Option<String> = None;
    for message in messages {
        let n = forest.add();
        let same = subject.as_deref() == Some(message.keys.subject.as_str());
        subject = Some(message.keys.subject.clone());
        forest.nodes[n].message = Some(message);
        match roots.last() {
            Some(&root) if same => {
                forest.link(root, n);
            }
            _ => roots.push(n),
        }
    }
    roots.sort_by_key(|&n| forest.date_key(n));
    roots.iter().filter_map(|&n| forest.thread(n)).collect()
}

/// RFC 5256 §4 REFERENCES over `messages` (in mailbox order).
fn references(messages: Vec<Message>) -> Vec<Thread> {
    let mut forest = Forest::default();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    let mut container = |forest: &mut Forest, id: &str| *by_id.entry(id.to_string()).or_insert_with(|| forest.add());
    for message in messages {
        // Step 1: a message without a Message-ID, or with one already taken, gets its own.
        let own = match message.keys.message_id.as_deref() {
            Some(id) => {
                let c = container(&mut forest, id);
                if forest.nodes[c].message.is_some() { forest.add() } else { c }
            }
            None => forest.add(),
        };
        // Step 1A: each reference is the parent of the next, unless the next has one already.
        let refs: Vec<usize> = message.keys.references.iter().map(|r| container(&mut forest, r)).collect();
        for pair in refs.windows(2) {
            if forest.nodes[pair[1]].parent.is_none() && pair[0] != pair[1] {
                forest.link(pair[0], pair[1]);
            }
        }
        // Step 1B: the last reference is the message's parent (replacing any it had).
        forest.unlink(own);
        if let Some(&parent) = refs.last()
            && parent != own
        {
            forest.link(parent, own);
        }
        forest.nodes[own].message = Some(message);
    }
    // Steps 2-4: the root set, pruned, sorted; step 5 gathers by subject; step 6 sorts again.
    let roots: Vec<usize> = (0..forest.nodes.len()).filter(|&n| forest.nodes[n].parent.is_none()).collect();
    let mut roots = forest.prune(roots, true);
    forest.sort_level(&mut roots);
    let mut roots = forest.gather_by_subject(roots);
    forest.sort_level(&mut roots);
    roots.iter().filter_map(|&n| forest.thread(n)).collect()
}

pub(crate) fn run(
    s: &mut Session,
    algorithm: ThreadingAlgorithm<'static>,
    charset: Charset<'static>,
    search: Vec1<SearchKey<'static>>,
    uid: bool,
) -> Result<Done, ImapError> {
    let ordered = match algorithm {
        ThreadingAlgorithm::References => false,
        ThreadingAlgorithm::OrderedSubject => true,
        _ => return Err(ImapError::no("only REFERENCES and ORDEREDSUBJECT threading are supported")),
    };
    check_charset(&charset)?;
    let hits = matching(s, search.as_ref())?;
    let mut messages = Vec::with_capacity(hits.len());
    for (index, _, _, keys) in keys_of(s, &hits)? {
        if let Some(number) = number(s, index, uid) {
            messages.push(Message { number, index, keys });
        }
    }
    s.data(Data::Thread(if ordered { ordered_subject(messages) } else { references(messages) }));
    Ok(Done::ok(if uid { "UID THREAD completed" } else { "THREAD completed" }))
}
