//! Reading the search index and listing a session's spans.
//!
//! The writer indexes every span when it stores it, in the same
//! transaction (see `writer::index_span`): the index can never hold a
//! span the store does not, nor miss one it holds, whatever point a
//! crash interrupts. Reads here run under one snapshot, so a search sees
//! each batch wholly or not at all. They walk the engine and decode
//! records: call them off the async runtime's workers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ctxbroker_core::search::{self, CorpusStats, Posting, SpanFilter, Standing};
use ctxbroker_core::{Span, SpanId};

use crate::blocks;
use crate::error::StoreError;
use crate::keys::{self, TreeId};
use crate::model::{SpanState, StoredSpan};
use crate::record;
use crate::store::{Store, count_walk, get_counted, walk_live};

/// A search of one session's spans, live and archived.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SearchQuery {
    /// The query's terms ([`search::query_terms`]).
    pub terms: Vec<String>,
    /// Which spans to keep.
    pub filter: SpanFilter,
    /// Kept hits to skip: the page's start.
    pub offset: usize,
    /// Kept hits to return at most.
    pub limit: usize,
}

/// One span a search found.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    /// The span and where it is now.
    pub stored: StoredSpan,
    /// Its BM25 score for the query.
    pub score: f64,
}

/// A page of a search.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SearchPage {
    /// The hits, best first.
    pub hits: Vec<SearchHit>,
    /// Spans whose term vectors hold at least one query term's key,
    /// before the filter.
    pub matched: u64,
    /// Whether kept hits follow this page.
    pub more: bool,
}

/// A page of a listing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SpanListing {
    /// The spans, by id.
    pub spans: Vec<StoredSpan>,
    /// Whether kept spans follow this page.
    pub more: bool,
}

impl Store {
    /// Ranks a session's spans, live and archived, against the query's
    /// terms, and returns the page of kept hits the query asks for.
    pub fn search(&self, session: &str, query: &SearchQuery) -> Result<SearchPage, StoreError> {
        self.reading("search");
        keys::check_session_id(session)?;
        let _snapshot = self.snapshot();
        self.require_session(session)?;
        let keys_of: Vec<u32> = query.terms.iter().map(|t| search::term_key(t)).collect();
        let (totals, postings) = self
            .shared()
            .search
            .postings(self.trees(), session, &keys_of)?;
        let ranked = search::rank(totals, &postings);
        let mut page = SearchPage {
            matched: ranked.len() as u64,
            ..SearchPage::default()
        };
        let mut spans = Resolver::new(self, session);
        let mut kept = 0usize;
        for (span_id, score) in ranked {
            // The index and the spans are written together; a posting
            // whose span cannot be read is a damaged record, reported by
            // the read itself.
            let Some(stored) = spans.get(span_id)? else {
                continue;
            };
            // Terms are kept as 20-bit keys: confirm one is really there,
            // in the text or, for a compressed constraint, the text as
            // admitted (which is what was indexed).
            let original = stored.span.original.as_ref().map(|o| o.text.as_str());
            if !search::holds_any(&stored.span.text, &query.terms)
                && !original.is_some_and(|text| search::holds_any(text, &query.terms))
            {
                continue;
            }
            if !query.filter.keeps(&stored.span, standing(stored.state)) {
                continue;
            }
            kept += 1;
            if kept <= query.offset {
                continue;
            }
            if page.hits.len() == query.limit {
                page.more = true;
                break;
            }
            page.hits.push(SearchHit { stored, score });
        }
        Ok(page)
    }

    /// A session's spans, live and archived, in id order (the order they
    /// were admitted; a summary's id is the one it got when written),
    /// from the first id after `after`, at most `limit` of those the
    /// filter keeps.
    pub fn list_spans(
        &self,
        session: &str,
        filter: &SpanFilter,
        after: Option<SpanId>,
        limit: usize,
    ) -> Result<SpanListing, StoreError> {
        self.reading("list_spans");
        keys::check_session_id(session)?;
        let _snapshot = self.snapshot();
        self.require_session(session)?;
        let trees = self.trees();
        let start = after.map_or(0, |id| id.saturating_add(1));
        let mut live: Vec<Span> = Vec::new();
        walk_live(trees, session, |key, row| {
            let span = record::decode_span(key, row)?;
            if span.id >= start {
                live.push(span);
            }
            Ok(())
        })?;
        live.sort_by_key(|s| s.id);
        let mut live = live.into_iter().peekable();
        let archived = keys::session_numbers_from(session, start);
        let mut archive = trees.archive.range(archived.clone()).peekable();
        let mut listing = SpanListing::default();
        loop {
            let next_archived = match archive.peek() {
                Some(Ok((key, _))) => keys::parse_session_number_key(key).map(|(_, id)| id),
                Some(Err(_)) => Some(0),
                None => None,
            };
            let next_live = live.peek().map(|s| s.id);
            let stored = match (next_archived, next_live) {
                (None, None) => break,
                (Some(a), l) if l.is_none_or(|l| a < l) => {
                    let Some(entry) = archive.next() else { break };
                    let (key, value) = entry.map_err(StoreError::engine)?;
                    let (span, by_seq) = record::decode_archived(&key, &value)?;
                    StoredSpan {
                        span,
                        state: SpanState::Archived { by_seq },
                    }
                }
                _ => {
                    let Some(span) = live.next() else { break };
                    StoredSpan {
                        span,
                        state: SpanState::Live,
                    }
                }
            };
            if !filter.keeps(&stored.span, standing(stored.state)) {
                continue;
            }
            if listing.spans.len() == limit {
                listing.more = true;
                break;
            }
            listing.spans.push(stored);
        }
        count_walk(trees.archive.range(archived))?;
        Ok(listing)
    }
}

fn standing(state: SpanState) -> Standing {
    match state {
        SpanState::Live => Standing::Live,
        SpanState::Archived { .. } => Standing::Archived,
    }
}

/// Reads spans by id under the caller's snapshot: the archive by key, a
/// live span at the position equal to its id, and summaries (which stand
/// elsewhere) from one walk of the live spans, taken on the first miss.
pub(crate) struct Resolver<'a> {
    store: &'a Store,
    session: &'a str,
    live_by_id: Option<HashMap<SpanId, Span>>,
}

impl<'a> Resolver<'a> {
    pub(crate) fn new(store: &'a Store, session: &'a str) -> Self {
        Resolver {
            store,
            session,
            live_by_id: None,
        }
    }

    pub(crate) fn get(&mut self, span_id: SpanId) -> Result<Option<StoredSpan>, StoreError> {
        let trees = self.store.trees();
        let key = keys::session_number_key(self.session, span_id);
        if let Some(value) = get_counted(&trees.archive, &key)? {
            let (span, by_seq) = record::decode_archived(&key, &value)?;
            return Ok(Some(StoredSpan {
                span,
                state: SpanState::Archived { by_seq },
            }));
        }
        let row = blocks::row_at(self.session, span_id, |tree, key| {
            Ok(get_counted(trees.tree(tree), key)?.map(|value| value.to_vec()))
        })?;
        if let Some(value) = row {
            let span = record::decode_span(&key, &value)?;
            if span.id == span_id {
                return Ok(Some(StoredSpan {
                    span,
                    state: SpanState::Live,
                }));
            }
        }
        if self.live_by_id.is_none() {
            let mut by_id = HashMap::new();
            walk_live(trees, self.session, |key, row| {
                let span = record::decode_span(key, row)?;
                by_id.insert(span.id, span);
                Ok(())
            })?;
            self.live_by_id = Some(by_id);
        }
        Ok(self
            .live_by_id
            .as_ref()
            .and_then(|by_id| by_id.get(&span_id))
            .map(|span| StoredSpan {
                span: span.clone(),
                state: SpanState::Live,
            }))
    }
}

/// The postings of recently searched sessions, in memory, bounded by
/// their estimated bytes. A session's entry holds the term vectors of its
/// spans up to the highest id read; span ids only grow, and an admitted
/// span's position is its id, so a later search reads only the live spans
/// at positions past it and the archived spans with ids past it. A
/// summary takes the position of what it replaces, so the writer forgets
/// the session when it stores one, as when a session is deleted,
/// imported or has spans taken back, under its exclusive hold.
#[derive(Debug)]
pub(crate) struct IndexCache {
    budget: usize,
    state: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    sessions: HashMap<String, Cached>,
    tick: u64,
}

#[derive(Debug)]
struct Cached {
    index: Arc<Mutex<SessionIndex>>,
    last_used: u64,
    bytes: usize,
    /// The session's postings outgrew the whole budget: it is searched
    /// by reading its term vectors every time.
    oversize: bool,
}

/// One session's postings.
#[derive(Debug, Default)]
struct SessionIndex {
    /// The highest span id read, if any.
    through: Option<SpanId>,
    /// Per document: span id and length.
    docs: Vec<(SpanId, u32)>,
    /// Per term key: (document index, frequency).
    postings: HashMap<u32, Vec<(u32, u32)>>,
    /// Postings held, for the estimate.
    entries: usize,
    total_length: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SessionIndex {
    /// Reads the term vectors stored past `through`; false, with the
    /// reading stopped, once the postings pass `budget` bytes.
    fn catch_up(
        &mut self,
        trees: &crate::writer::Trees,
        session: &str,
        budget: usize,
    ) -> Result<bool, StoreError> {
        let from = self.through.map_or(0, |t| t.saturating_add(1));
        for (tree, rows) in trees.span_rows() {
            // A packed block's run stands at the block's first position,
            // which may come before `from`.
            let start = match tree {
                TreeId::Runs => blocks::block_start(from),
                _ => from,
            };
            // Keys of one session sort by their number.
            let first = keys::session_number_key(session, from);
            for entry in rows.range(keys::session_numbers_from(session, start)) {
                let (key, value) = entry.map_err(StoreError::engine)?;
                let mut within = true;
                blocks::rows_of(tree, &key, &value, |tree, key, row| {
                    if within && key >= first.as_slice() {
                        within = self.index(tree, key, row, budget)?;
                    }
                    Ok(())
                })?;
                if !within {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Adds one span's term vector; false once the postings pass `budget`
    /// bytes.
    fn index(
        &mut self,
        tree: TreeId,
        key: &[u8],
        row: &[u8],
        budget: usize,
    ) -> Result<bool, StoreError> {
        let (span_id, packed) = record::stored_terms(tree, key, row)?;
        let vector = record::decode_terms(tree, key, &packed)?;
        let doc = u32::try_from(self.docs.len()).unwrap_or(u32::MAX);
        self.docs.push((span_id, vector.length));
        self.total_length += u64::from(vector.length);
        for e in &vector.entries {
            self.postings
                .entry(e >> 8)
                .or_default()
                .push((doc, e & 0xff));
        }
        self.entries += vector.entries.len();
        self.through = Some(self.through.map_or(span_id, |t| t.max(span_id)));
        Ok(self.bytes() <= budget)
    }

    /// What the postings take, roughly: eight bytes a posting, sixteen a
    /// document, and a map slot with its vector per key.
    fn bytes(&self) -> usize {
        self.entries * 8 + self.docs.len() * 16 + self.postings.len() * 48
    }

    fn answer(&self, term_keys: &[u32]) -> (CorpusStats, Vec<Vec<Posting>>) {
        let totals = CorpusStats {
            spans: self.docs.len() as u64,
            total_length: self.total_length,
        };
        let postings = term_keys
            .iter()
            .map(|k| {
                self.postings
                    .get(k)
                    .map(|list| {
                        list.iter()
                            .filter_map(|&(doc, frequency)| {
                                let &(span_id, length) = self.docs.get(doc as usize)?;
                                Some(Posting {
                                    span_id,
                                    frequency,
                                    length,
                                })
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect();
        (totals, postings)
    }
}

impl IndexCache {
    pub(crate) fn new(budget: usize) -> IndexCache {
        IndexCache {
            budget,
            state: Mutex::new(CacheState::default()),
        }
    }

    /// Drops a session's postings.
    pub(crate) fn forget(&self, session: &str) {
        lock(&self.state).sessions.remove(session);
    }

    /// The session's totals and, per term key, the spans that hold it,
    /// from the cached postings brought up to date. The caller holds the
    /// store's snapshot.
    fn postings(
        &self,
        trees: &crate::writer::Trees,
        session: &str,
        term_keys: &[u32],
    ) -> Result<(CorpusStats, Vec<Vec<Posting>>), StoreError> {
        let index = {
            let mut state = lock(&self.state);
            state.tick += 1;
            let tick = state.tick;
            let cached = state
                .sessions
                .entry(session.to_owned())
                .or_insert_with(|| Cached {
                    index: Arc::new(Mutex::new(SessionIndex::default())),
                    last_used: tick,
                    bytes: 0,
                    oversize: false,
                });
            cached.last_used = tick;
            if cached.oversize {
                drop(state);
                return read_postings(trees, session, term_keys);
            }
            Arc::clone(&cached.index)
        };
        let mut held = lock(&index);
        match held.catch_up(trees, session, self.budget) {
            Ok(true) => {}
            Ok(false) => {
                *held = SessionIndex::default();
                drop(held);
                if let Some(cached) = lock(&self.state).sessions.get_mut(session) {
                    cached.oversize = true;
                    cached.bytes = 0;
                }
                return read_postings(trees, session, term_keys);
            }
            Err(err) => {
                // A damaged row: nothing half-read stays behind.
                drop(held);
                self.forget(session);
                return Err(err);
            }
        }
        let answer = held.answer(term_keys);
        let bytes = held.bytes();
        drop(held);
        self.settle(session, bytes);
        Ok(answer)
    }

    /// Records a session's size and drops the least recently searched
    /// sessions while the total is over the budget, the session itself
    /// last.
    fn settle(&self, session: &str, bytes: usize) {
        let mut state = lock(&self.state);
        if let Some(cached) = state.sessions.get_mut(session) {
            cached.bytes = bytes;
        }
        loop {
            let total: usize = state.sessions.values().map(|c| c.bytes).sum();
            if total <= self.budget {
                return;
            }
            let victim = state
                .sessions
                .iter()
                .filter(|(id, _)| id.as_str() != session)
                .min_by_key(|(_, c)| c.last_used)
                .map(|(id, _)| id.clone())
                .unwrap_or_else(|| session.to_owned());
            state.sessions.remove(&victim);
        }
    }
}

/// The session's totals and postings for `term_keys`, read from every
/// term vector of the session: for sessions too large to cache.
fn read_postings(
    trees: &crate::writer::Trees,
    session: &str,
    term_keys: &[u32],
) -> Result<(CorpusStats, Vec<Vec<Posting>>), StoreError> {
    let mut postings: Vec<Vec<Posting>> = vec![Vec::new(); term_keys.len()];
    let mut totals = CorpusStats::default();
    let prefix = keys::session_prefix(session);
    for (tree, rows) in trees.span_rows() {
        for entry in rows.scan_prefix(&prefix) {
            let (key, value) = entry.map_err(StoreError::engine)?;
            blocks::rows_of(tree, &key, &value, |tree, key, row| {
                let (span_id, packed) = record::stored_terms(tree, key, row)?;
                let (length, frequencies) =
                    record::term_frequencies(tree, key, &packed, term_keys)?;
                totals.spans += 1;
                totals.total_length += u64::from(length);
                for (holders, frequency) in postings.iter_mut().zip(frequencies) {
                    if frequency > 0 {
                        holders.push(Posting {
                            span_id,
                            frequency,
                            length,
                        });
                    }
                }
                Ok(())
            })?;
        }
    }
    Ok((totals, postings))
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    #[test]
    fn the_budget_drops_the_least_recently_searched_first() {
        let cache = IndexCache::new(100);
        for (id, bytes) in [("a", 40), ("b", 40)] {
            lock(&cache.state).sessions.insert(
                id.into(),
                Cached {
                    index: Arc::default(),
                    last_used: if id == "a" { 1 } else { 2 },
                    bytes,
                    oversize: false,
                },
            );
        }
        lock(&cache.state).sessions.insert(
            "c".into(),
            Cached {
                index: Arc::default(),
                last_used: 3,
                bytes: 0,
                oversize: false,
            },
        );
        cache.settle("c", 40);
        let mut left: Vec<String> = lock(&cache.state).sessions.keys().cloned().collect();
        left.sort();
        assert_eq!(left, ["b", "c"]);
        // A session larger than the budget is not kept.
        cache.settle("c", 500);
        assert!(lock(&cache.state).sessions.is_empty());
    }
}
