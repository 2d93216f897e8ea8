//! A connection an event loop serves, whichever listener took it: the proxy's TCP listener
//! (`Left`) or the Unix socket a sandbox reaches the proxy through (`Right`). One type, so
//! that both are placed, handed between loops, counted and drained alike; tokio-util's
//! `Either` passes reads and (vectored) writes through to the socket.

use std::io;

use tokio::net::{TcpStream, UnixStream};
use tokio_util::either::Either;

/// An accepted connection, on a loop's runtime.
pub type Conn = Either<TcpStream, UnixStream>;

/// A connection off any runtime, on its way from the loop that accepted it to the loop that
/// serves it.
#[derive(Debug)]
pub(super) enum Handed {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

/// Off this loop's runtime (still non-blocking), to be handed to another.
pub(super) fn into_std(conn: Conn) -> io::Result<Handed> {
    match conn {
        Either::Left(s) => s.into_std().map(Handed::Tcp),
        Either::Right(s) => s.into_std().map(Handed::Unix),
    }
}

/// Onto the calling loop's runtime.
pub(super) fn from_std(handed: Handed) -> io::Result<Conn> {
    match handed {
        Handed::Tcp(s) => TcpStream::from_std(s).map(Either::Left),
        Handed::Unix(s) => UnixStream::from_std(s).map(Either::Right),
    }
}
