//! Connections closed the way a web server closes them: lingering.
//!
//! When a stopping server has sent a stream's last bytes, HTTP/2 closes the connection. If
//! the socket is closed while its client is still sending (the flow-control updates it sends
//! as it reads the stream's tail), the kernel answers with a reset, and the client's kernel
//! then drops whatever it had received and not yet read: the stream that was sent whole
//! arrives cut, as `ConnectionReset` (seen once under the full test suite's load in
//! `e2e::shutdown::a_stream_in_flight_finishes_whole_when_the_server_stops`; not reproduced
//! on demand in 16 runs under load, with or without this). So a socket
//! the server is done with is shut for writing (a FIN after everything sent) and read until
//! its client closes too, for at most [`LINGER`], before it is closed, as nginx's
//! `lingering_close` and Apache's lingering close do.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// How long a closed connection's socket waits for its client to close its side.
pub const LINGER: Duration = Duration::from_secs(5);

/// An accepted connection whose socket lingers once the server drops it.
#[derive(Debug)]
pub struct Lingering(Option<TcpStream>);

impl Lingering {
    pub fn new(stream: TcpStream) -> Self {
        Self(Some(stream))
    }

    fn stream(self: Pin<&mut Self>) -> Pin<&mut TcpStream> {
        match &mut self.get_mut().0 {
            Some(stream) => Pin::new(stream),
            None => unreachable!("the stream is taken only when dropped"),
        }
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let (Some(mut stream), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        pushdown_task::detach_on(&runtime, async move {
            let _ = stream.shutdown().await;
            let mut sink = [0u8; 4096];
            let _ = tokio::time::timeout(LINGER, async {
                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
            })
            .await;
        });
    }
}

impl AsyncRead for Lingering {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.stream().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.stream().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.as_ref().is_some_and(TcpStream::is_write_vectored)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_shutdown(cx)
    }
}

impl Connected for Lingering {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match &self.0 {
            Some(stream) => stream.connect_info(),
            None => TcpConnectInfo {
                local_addr: None,
                remote_addr: None,
            },
        }
    }
}
