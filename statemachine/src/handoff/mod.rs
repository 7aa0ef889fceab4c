//! Handoff: moving responsibility for one step of work from one process to another.
//!
//! A ticket is data, not a message: handing off means rewriting its responsible party once, in
//! one atomic command. Before a successful [`take`](Desk::take) the source (`from`) is responsible
//! and may cancel; after it the addressee (`to`) is, and settles it with a receipt presented with
//! the store-minted token. One deadline (`clock + ttl`, on the store's clock) covers both taking
//! and replying; past it the ticket is `expired` and late takes and replies are refused. Offering
//! the same key again while the ticket is live replays it; after it is settled a new generation
//! starts, so late actors are told apart by generation and token.

mod check;
mod desk;
mod types;
mod validate;

pub use check::{check, Problem, ProblemCode};
pub use desk::Desk;
pub use types::{Command, Handle, OfferArgs, Receipt, ReceiptStatus, Ticket, TicketState};
