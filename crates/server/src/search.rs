//! SearchSpans and ListSpans: the requests checked, run on the store off
//! the async workers, and answered.
//!
//! Page tokens are opaque to callers: `o<n>` for a search (the hits
//! already returned) and `a<id>` for a listing (the last span id
//! returned). A token of the wrong shape names `page_token`.

use ctxbroker_core::search::{self, SpanFilter, Standing};
use ctxbroker_proto::v1 as pb;
use ctxbroker_store::{SearchQuery, Store};

use crate::blocking;
use crate::convert::{class_from_pb, role_from_pb, span_hit};
use crate::error::{ApiError, BadField};
use crate::validate;

/// The longest query, in bytes.
pub const MAX_QUERY_BYTES: usize = 4096;
/// Search hits per page by default, and at most.
const SEARCH_PAGE: (usize, usize) = (10, 100);
/// Listed spans per page by default, and at most.
const LIST_PAGE: (usize, usize) = (100, 1000);
/// Snippet characters by default, and at most.
const SNIPPET: (usize, usize) = (240, 2000);

/// A checked SearchSpans request.
#[derive(Debug, Clone, PartialEq)]
pub struct Search {
    /// What the store runs.
    pub query: SearchQuery,
    /// Snippet length in characters.
    pub snippet_chars: usize,
}

/// A checked ListSpans request.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    /// Which spans to keep.
    pub filter: SpanFilter,
    /// List from the first span after this id.
    pub after: Option<u64>,
    /// At most this many spans.
    pub limit: usize,
    /// Snippet length in characters.
    pub snippet_chars: usize,
}

/// Checks a SearchSpans request (the session id is checked by the caller).
pub fn check_search(req: &pb::SearchSpansRequest) -> Result<Search, ApiError> {
    let mut bad = Vec::new();
    let mut terms = Vec::new();
    if req.query.len() > MAX_QUERY_BYTES {
        bad.push(BadField::new(
            "query",
            format!(
                "must be at most {MAX_QUERY_BYTES} bytes; got {}",
                req.query.len()
            ),
        ));
    } else {
        terms = search::query_terms(&req.query);
        if terms.is_empty() {
            bad.push(BadField::new(
                "query",
                "must hold at least one word: two or more letters, digits or '_', or one digit (common words such as \"the\" are not searched)",
            ));
        }
    }
    let filter = span_filter(req.filter.as_ref(), &mut bad);
    let limit = validate::bounded("page_size", req.page_size, SEARCH_PAGE, &mut bad);
    let snippet_chars = validate::bounded("snippet_chars", req.snippet_chars, SNIPPET, &mut bad);
    let offset = match req.page_token.strip_prefix('o') {
        _ if req.page_token.is_empty() => 0,
        Some(n) => n.parse::<usize>().unwrap_or_else(|_| {
            bad.push(not_a_token("SearchSpans"));
            0
        }),
        None => {
            bad.push(not_a_token("SearchSpans"));
            0
        }
    };
    validate::finish(bad)?;
    Ok(Search {
        query: SearchQuery {
            terms,
            filter,
            offset,
            limit,
        },
        snippet_chars,
    })
}

/// Checks a ListSpans request (the session id is checked by the caller).
pub fn check_listing(req: &pb::ListSpansRequest) -> Result<Listing, ApiError> {
    let mut bad = Vec::new();
    let filter = span_filter(req.filter.as_ref(), &mut bad);
    let limit = validate::bounded("page_size", req.page_size, LIST_PAGE, &mut bad);
    let snippet_chars = validate::bounded("snippet_chars", req.snippet_chars, SNIPPET, &mut bad);
    let after = match req.page_token.strip_prefix('a') {
        _ if req.page_token.is_empty() => None,
        Some(n) => match n.parse::<u64>() {
            Ok(id) => Some(id),
            Err(_) => {
                bad.push(not_a_token("ListSpans"));
                None
            }
        },
        None => {
            bad.push(not_a_token("ListSpans"));
            None
        }
    };
    validate::finish(bad)?;
    Ok(Listing {
        filter,
        after,
        limit,
        snippet_chars,
    })
}

fn not_a_token(rpc: &str) -> BadField {
    BadField::new("page_token", format!("is not a token returned by {rpc}"))
}

fn span_filter(filter: Option<&pb::SpanFilter>, bad: &mut Vec<BadField>) -> SpanFilter {
    let Some(f) = filter else {
        return SpanFilter::default();
    };
    let mut out = SpanFilter {
        from_turn: f.from_turn,
        to_turn: f.to_turn,
        ..SpanFilter::default()
    };
    for (i, &role) in f.roles.iter().enumerate() {
        let field = format!("filter.roles[{i}]");
        match pb::Role::try_from(role).ok().and_then(role_from_pb) {
            Some(role) => out.roles.push(role),
            None => bad.push(BadField::new(
                field,
                format!("must be ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL or ROLE_SYSTEM; got {role}"),
            )),
        }
    }
    for (i, &class) in f.span_classes.iter().enumerate() {
        let field = format!("filter.span_classes[{i}]");
        match pb::SpanClass::try_from(class).ok().and_then(class_from_pb) {
            Some(class) => out.classes.push(class),
            None => bad.push(BadField::new(
                field,
                format!("must be a SpanClass other than SPAN_CLASS_UNSPECIFIED; got {class}"),
            )),
        }
    }
    if let (Some(from), Some(to)) = (f.from_turn, f.to_turn)
        && from > to
    {
        bad.push(BadField::new(
            "filter.to_turn",
            format!("must be at least filter.from_turn ({from}); got {to}"),
        ));
    }
    match pb::SpanState::try_from(f.state) {
        Ok(pb::SpanState::Unspecified) => {}
        Ok(pb::SpanState::Live) => out.standing = Some(Standing::Live),
        Ok(pb::SpanState::Archived) => out.standing = Some(Standing::Archived),
        Err(_) => bad.push(BadField::new(
            "filter.state",
            format!(
                "must be SPAN_STATE_LIVE, SPAN_STATE_ARCHIVED or unspecified; got {}",
                f.state
            ),
        )),
    }
    out
}

/// Runs a search on the store, off the async workers.
pub async fn run_search(
    store: &Store,
    session: &str,
    request: Search,
) -> Result<pb::SearchSpansResponse, ApiError> {
    let session = session.to_owned();
    blocking::read(store, move |store| {
        let page = store.search(&session, &request.query)?;
        let hits: Vec<pb::SpanHit> = page
            .hits
            .iter()
            .map(|hit| {
                // A compressed constraint may match only as admitted.
                let span = &hit.stored.span;
                let text = match &span.original {
                    Some(o) if !search::holds_any(&span.text, &request.query.terms) => &o.text,
                    _ => &span.text,
                };
                let snippet = search::snippet(text, &request.query.terms, request.snippet_chars);
                span_hit(&hit.stored, hit.score, snippet)
            })
            .collect();
        let next_page_token = if page.more {
            format!("o{}", request.query.offset + hits.len())
        } else {
            String::new()
        };
        Ok::<_, ApiError>(pb::SearchSpansResponse {
            hits,
            next_page_token,
            matched: page.matched,
        })
    })
    .await
}

/// Lists spans from the store, off the async workers.
pub async fn run_listing(
    store: &Store,
    session: &str,
    request: Listing,
) -> Result<pb::ListSpansResponse, ApiError> {
    let session = session.to_owned();
    blocking::read(store, move |store| {
        let listing = store.list_spans(&session, &request.filter, request.after, request.limit)?;
        let spans: Vec<pb::SpanHit> = listing
            .spans
            .iter()
            .map(|stored| {
                let text = search::snippet(&stored.span.text, &[], request.snippet_chars);
                span_hit(stored, 0.0, text)
            })
            .collect();
        let next_page_token = match (listing.more, spans.last()) {
            (true, Some(last)) => format!("a{}", last.span_id),
            _ => String::new(),
        };
        Ok::<_, ApiError>(pb::ListSpansResponse {
            spans,
            next_page_token,
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(err: ApiError) -> Vec<String> {
        match err {
            ApiError::InvalidArgument(bad) => bad.into_iter().map(|b| b.field).collect(),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn every_bad_search_field_is_named() {
        let req = pb::SearchSpansRequest {
            session_id: "s".into(),
            query: "the . !".into(),
            filter: Some(pb::SpanFilter {
                roles: vec![0, 9],
                span_classes: vec![0],
                from_turn: Some(5),
                to_turn: Some(4),
                state: 7,
            }),
            page_size: 101,
            page_token: "x1".into(),
            snippet_chars: 2001,
        };
        let got = check_search(&req).map(|_| ()).map_err(fields);
        assert_eq!(
            got,
            Err(vec![
                "query".to_owned(),
                "filter.roles[0]".into(),
                "filter.roles[1]".into(),
                "filter.span_classes[0]".into(),
                "filter.to_turn".into(),
                "filter.state".into(),
                "page_size".into(),
                "snippet_chars".into(),
                "page_token".into(),
            ])
        );
        let long = pb::SearchSpansRequest {
            query: "x".repeat(MAX_QUERY_BYTES + 1),
            ..Default::default()
        };
        assert_eq!(
            check_search(&long).map(|_| ()).map_err(fields),
            Err(vec!["query".to_owned()])
        );
    }

    #[test]
    fn a_good_search_takes_the_defaults() {
        let req = pb::SearchSpansRequest {
            query: "src/lib.rs E0308".into(),
            page_token: "o20".into(),
            ..Default::default()
        };
        let Ok(search) = check_search(&req) else {
            panic!("refused a good request");
        };
        assert_eq!(search.query.terms, ["src", "lib", "rs", "e0308"]);
        assert_eq!(search.query.offset, 20);
        assert_eq!(search.query.limit, SEARCH_PAGE.0);
        assert_eq!(search.snippet_chars, SNIPPET.0);
    }

    #[test]
    fn listing_tokens_and_sizes_are_checked() {
        let ok = check_listing(&pb::ListSpansRequest {
            page_token: "a41".into(),
            page_size: 5,
            ..Default::default()
        });
        assert!(matches!(
            ok,
            Ok(Listing {
                after: Some(41),
                limit: 5,
                ..
            })
        ));
        let bad = check_listing(&pb::ListSpansRequest {
            page_token: "o3".into(),
            page_size: 1001,
            ..Default::default()
        });
        assert_eq!(
            bad.map(|_| ()).map_err(fields),
            Err(vec!["page_size".to_owned(), "page_token".into()])
        );
    }
}
