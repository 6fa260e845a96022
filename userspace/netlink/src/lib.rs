//! rtnetlink without an async runtime, shared by the agent and the CNI
//! plugin: the messages rivet sends, built and read as pure functions
//! ([`messages`]), and a blocking route socket that sends them and waits for
//! the kernel's acknowledgements ([`socket`]).
//!
//! It depends on the `netlink-packet-*` crates, `netlink-sys` and `libc`
//! only: the plugin is a small static binary. The agent's async handle
//! (`rtnetlink`) takes the same message types.

pub mod messages;
pub mod socket;

pub use netlink_packet_core as packet_core;
pub use netlink_packet_route as packet_route;

pub use self::{
    messages::{LinkInfo, RouteInfo},
    socket::RouteSocket,
};

use netlink_packet_core::ErrorMessage;

/// A failed netlink exchange.
#[derive(Debug)]
pub enum Error {
    /// The socket failed.
    Io(std::io::Error),
    /// The kernel refused the request.
    Kernel(ErrorMessage),
    /// A message from the kernel did not parse.
    Decode(String),
}

impl Error {
    /// The errno it stands for (positive): the kernel's answer, the
    /// socket's error, `EPROTO` for a message that does not parse.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Kernel(m) => -m.raw_code(),
            Error::Decode(_) => libc::EPROTO,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "netlink socket: {e}"),
            Error::Kernel(_) => write!(f, "{}", std::io::Error::from_raw_os_error(self.errno())),
            Error::Decode(what) => write!(f, "decoding a netlink message: {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Io(e) => e,
            Error::Kernel(_) => std::io::Error::from_raw_os_error(e.errno()),
            Error::Decode(_) => std::io::Error::other(e.to_string()),
        }
    }
}
