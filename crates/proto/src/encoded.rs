//! Messages encoded once and written many times.
//!
//! A server that sends one message to many streams (a compaction marker to
//! every watcher) encodes it once into an [`Encoded`] and gives each stream
//! a clone, which shares the bytes rather than copying them. Its
//! [`prost::Message`] implementation writes those bytes as they are, so a
//! codec that encodes an `Encoded<M>` writes exactly what it would have
//! written for the `M` itself, and a client decodes an `M`.
//!
//! The server generated for the daemon (see `build.rs`) streams
//! `Encoded<WatchCompactionsResponse>` from `WatchCompactions`; every other
//! method, and the client, use the generated messages.

use std::fmt;
use std::marker::PhantomData;

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType};
use prost::{DecodeError, Message};

/// The protobuf encoding of an `M`. Cloning shares the bytes.
pub struct Encoded<M> {
    bytes: Bytes,
    message: PhantomData<fn() -> M>,
}

impl<M: Message> Encoded<M> {
    /// Encodes `message`.
    pub fn new(message: &M) -> Self {
        Encoded::from_bytes(Bytes::from(message.encode_to_vec()))
    }
}

impl<M> Encoded<M> {
    /// Bytes [`Encoded::new`] made (and [`Encoded::into_bytes`] gave
    /// back), for a cache that keeps them without their type. They are
    /// written as they are, not checked.
    pub fn from_bytes(bytes: Bytes) -> Self {
        Encoded {
            bytes,
            message: PhantomData,
        }
    }

    /// The encoding.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The encoding, shared.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }
}

impl<M> Clone for Encoded<M> {
    fn clone(&self) -> Self {
        Encoded::from_bytes(self.bytes.clone())
    }
}

/// The empty encoding: an `M` whose fields all hold their defaults.
impl<M> Default for Encoded<M> {
    fn default() -> Self {
        Encoded::from_bytes(Bytes::new())
    }
}

impl<M> PartialEq for Encoded<M> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl<M> Eq for Encoded<M> {}

impl<M> fmt::Debug for Encoded<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoded")
            .field("message", &std::any::type_name::<M>())
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl<M: Message + Default> Message for Encoded<M> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.bytes);
    }

    /// Not what this type is for, but correct: merges the field into the
    /// `M` these bytes encode, and keeps that message's encoding.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let mut message = M::decode(self.bytes.as_ref())?;
        message.merge_field(tag, wire_type, buf, ctx)?;
        *self = Encoded::new(&message);
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.bytes.len()
    }

    fn clear(&mut self) {
        self.bytes = Bytes::new();
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::Encoded;
    use crate::v1 as pb;

    fn marker_event() -> pb::WatchCompactionsResponse {
        pb::WatchCompactionsResponse {
            event: Some(pb::watch_compactions_response::Event::Marker(
                pb::CompactionMarker {
                    seq: 7,
                    session_id: "s".into(),
                    session_seq: 3,
                    trigger: pb::CompactionTrigger::HardBudget as i32,
                    outcome: pb::CompactionOutcome::Committed as i32,
                    tokens_before: 900,
                    tokens_after: 400,
                    evicted_span_ids: vec![1, 2, 300],
                    summary_span_id: Some(0),
                    detail: "evicted 3".into(),
                    ..Default::default()
                },
            )),
        }
    }

    #[test]
    fn writes_what_the_message_itself_encodes_to() {
        let message = marker_event();
        let encoded = Encoded::new(&message);
        assert_eq!(encoded.encoded_len(), message.encoded_len());
        assert_eq!(encoded.encode_to_vec(), message.encode_to_vec());
        let mut framed = Vec::new();
        encoded.encode_length_delimited(&mut framed).unwrap();
        assert_eq!(framed, message.encode_length_delimited_to_vec());
        assert_eq!(
            pb::WatchCompactionsResponse::decode(encoded.as_bytes().clone()).unwrap(),
            message
        );
    }

    #[test]
    fn clones_share_the_bytes() {
        let encoded = Encoded::new(&marker_event());
        let clone = encoded.clone();
        assert_eq!(clone, encoded);
        assert_eq!(clone.as_bytes().as_ptr(), encoded.as_bytes().as_ptr());
    }

    #[test]
    fn decodes_and_merges_as_the_message_does() {
        let message = marker_event();
        let decoded =
            Encoded::<pb::WatchCompactionsResponse>::decode(message.encode_to_vec().as_slice())
                .unwrap();
        assert_eq!(decoded, Encoded::new(&message));

        // Two encodings one after the other merge, as protobuf says.
        let caught_up = pb::WatchCompactionsResponse {
            event: Some(pb::watch_compactions_response::Event::CaughtUp(
                pb::CaughtUp { next_seq: 9 },
            )),
        };
        let both = [message.encode_to_vec(), caught_up.encode_to_vec()].concat();
        let merged = Encoded::<pb::WatchCompactionsResponse>::decode(both.as_slice()).unwrap();
        assert_eq!(merged, Encoded::new(&caught_up));

        let mut cleared = Encoded::new(&message);
        cleared.clear();
        assert_eq!(cleared, Encoded::default());
        assert!(cleared.encode_to_vec().is_empty());
    }
}
