//! Small writes held back so that what HTTP/2 writes for one reply goes
//! out in as few system calls as it can.
//!
//! h2 buffers the frames it sends and copies a data frame's payload into
//! that buffer, unless the payload is at least its chaining threshold: 256
//! bytes when the connection takes vectored writes, 1,024 when it does
//! not. A chained payload must be written before h2 buffers anything
//! more, so a reply whose message is chained leaves in two writes: its
//! headers and message, then its trailers. Most replies of this service
//! (an admitted turn, a marker) are a few hundred bytes: over the first
//! threshold, under the second. A connection therefore tells h2 it takes
//! no vectored writes, which keeps such a message in h2's buffer, beside
//! its trailers; and a [`Stash`] keeps the cost of that off larger
//! payloads, which h2 then writes as its buffer first and the payload
//! after: the buffer, when small, is held back and leaves with the
//! payload in one vectored write.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::AsyncWrite;

/// The most bytes held back; a write that would pass it goes out with
/// what is held.
pub(crate) const STASH_MAX: usize = 1024;

/// Bytes accepted from the writer and not yet handed to the transport:
/// they go out with the next write that would not fit beside them, or at
/// the next flush or shutdown.
#[derive(Debug, Default)]
pub(crate) struct Stash {
    held: Vec<u8>,
}

impl Stash {
    /// Writes `buf`, or holds it back when it fits beside what is held.
    /// Returns how many bytes of `buf` were taken, as `poll_write` does.
    pub(crate) fn poll_write<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if self.held.len() + buf.len() <= STASH_MAX {
            self.held.extend_from_slice(buf);
            return Poll::Ready(Ok(buf.len()));
        }
        loop {
            if self.held.is_empty() {
                return Pin::new(&mut *io).poll_write(cx, buf);
            }
            let both = [io::IoSlice::new(&self.held), io::IoSlice::new(buf)];
            let n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &both))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if n <= self.held.len() {
                // Only held bytes went out (perhaps all of them): `buf`
                // is still to write.
                self.held.drain(..n);
                continue;
            }
            let taken = n - self.held.len();
            self.held.clear();
            return Poll::Ready(Ok(taken));
        }
    }

    /// Hands every held byte to the transport.
    pub(crate) fn poll_drain<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.held))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.held.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transport that records each call's bytes, takes at most `limit`
    /// bytes a call, and answers `Pending` to every call while `blocked`
    /// (waking the caller, as a socket would once writable).
    #[derive(Default)]
    struct Recorder {
        calls: Vec<Vec<u8>>,
        limit: usize,
        blocked: usize,
    }

    impl Recorder {
        fn new(limit: usize) -> Recorder {
            Recorder {
                limit,
                ..Recorder::default()
            }
        }

        fn take(
            &mut self,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            if self.blocked > 0 {
                self.blocked -= 1;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let mut call = Vec::new();
            for b in bufs {
                let room = self.limit - call.len();
                call.extend_from_slice(&b[..b.len().min(room)]);
            }
            let n = call.len();
            self.calls.push(call);
            Poll::Ready(Ok(n))
        }

        fn written(&self) -> Vec<u8> {
            self.calls.concat()
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().take(cx, &[io::IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().take(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Writes every buffer whole, as h2 does (retrying after `Pending`),
    /// then drains: what a flush does.
    fn write_all(stash: &mut Stash, io: &mut Recorder, bufs: &[Vec<u8>]) {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        for buf in bufs {
            let mut rest = buf.as_slice();
            while !rest.is_empty() {
                match stash.poll_write(io, &mut cx, rest) {
                    Poll::Ready(Ok(n)) => {
                        assert!(n > 0 && n <= rest.len(), "took {n} of {}", rest.len());
                        rest = &rest[n..];
                    }
                    Poll::Ready(Err(err)) => panic!("{err}"),
                    Poll::Pending => {}
                }
            }
        }
        loop {
            match stash.poll_drain(io, &mut cx) {
                Poll::Ready(Ok(())) => break,
                Poll::Ready(Err(err)) => panic!("{err}"),
                Poll::Pending => {}
            }
        }
    }

    #[test]
    fn a_frame_head_leaves_with_its_payload_in_one_call() {
        let (head, payload) = (bytes(120, 1), bytes(16 * 1024, 2));
        let mut io = Recorder::new(usize::MAX);
        let mut stash = Stash::default();
        write_all(&mut stash, &mut io, &[head.clone(), payload.clone()]);
        assert_eq!(io.calls.len(), 1, "one system call");
        assert_eq!(io.written(), [head, payload].concat());
    }

    #[test]
    fn small_writes_wait_for_the_flush_and_leave_together() {
        let parts = [bytes(300, 3), bytes(9, 4), bytes(200, 5)];
        let mut io = Recorder::new(usize::MAX);
        let mut stash = Stash::default();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        for part in &parts {
            assert!(matches!(
                stash.poll_write(&mut io, &mut cx, part),
                Poll::Ready(Ok(n)) if n == part.len()
            ));
        }
        assert!(io.calls.is_empty(), "nothing written before the flush");
        write_all(&mut stash, &mut io, &[]);
        assert_eq!(io.calls.len(), 1);
        assert_eq!(io.written(), parts.concat());
    }

    #[test]
    fn a_large_write_with_nothing_held_goes_straight_through() {
        let big = bytes(STASH_MAX + 1, 6);
        let mut io = Recorder::new(usize::MAX);
        let mut stash = Stash::default();
        write_all(&mut stash, &mut io, std::slice::from_ref(&big));
        assert_eq!(io.calls, vec![big]);
    }

    #[test]
    fn short_and_refused_writes_lose_and_repeat_nothing() {
        let bufs = [
            bytes(40, 7),
            bytes(3000, 8),
            bytes(1000, 9),
            bytes(25, 10),
            bytes(STASH_MAX, 11),
            bytes(1, 12),
            bytes(5000, 13),
        ];
        for limit in [1, 7, 40, 41, 100, 1024, 1025, 4096, usize::MAX] {
            for blocked in [0, 1, 3] {
                let mut io = Recorder::new(limit);
                io.blocked = blocked;
                let mut stash = Stash::default();
                write_all(&mut stash, &mut io, &bufs);
                assert_eq!(
                    io.written(),
                    bufs.concat(),
                    "limit {limit}, blocked {blocked}"
                );
            }
        }
    }

    #[test]
    fn a_transport_that_takes_nothing_is_an_error() {
        let mut io = Recorder::new(0);
        let mut stash = Stash::default();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(matches!(
            stash.poll_write(&mut io, &mut cx, &bytes(10, 14)),
            Poll::Ready(Ok(10))
        ));
        let big = bytes(STASH_MAX, 15);
        assert!(matches!(
            stash.poll_write(&mut io, &mut cx, &big),
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::WriteZero
        ));
        assert!(matches!(
            stash.poll_drain(&mut io, &mut cx),
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::WriteZero
        ));
    }
}
