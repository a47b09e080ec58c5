//! A writer's session: the connection, the turn and the pool they go back to, held together
//! from the moment a transaction has both until they are handed on, with the one settle
//! protocol every way out goes through.
//!
//! ```text
//!   Session::new(conn, turn, home)
//!        │
//!        ├─ settle(clean)   the outcome is known: the connection goes back (clean and at
//!        │                  depth 0) or is given up, then the turn goes on
//!        │
//!        ├─ abandon()       dropped mid-transaction: a rollback whose answer nobody reads,
//!        │                  the request lets go of the turn, and a background task (the write
//!        │                  path's one spawn, `Driver::spawn`) waits for that rollback, then
//!        │                  settles: clean if it ran within the pool's `acquire_timeout`
//!        │
//!        └─ dropped         whatever way it was lost (a task that never ran, a runtime
//!                           shutting down, a panic): settles as not clean, here and now
//! ```
//!
//! The connection always goes back before the turn goes on, so the next writer never meets
//! this session's lock; and it goes back exactly once, by `settle` or by `Drop`, whichever
//! comes first.

use std::sync::Arc;

use super::checkpoint::Checkpoints;
use super::driver::Driver;
use super::gate::CommitGate;
use super::group::Syncs;
use super::pool::{Conn, Shared, Target};
use crate::write::core::bound::{bound, within};
use crate::write::core::turn::Turn;

/// How deep a transaction's savepoints are rolled back before its connection is given up.
const MAX_DEPTH: usize = 64;

/// The connection, the turn and their home, settled once (see the module docs).
pub(crate) struct Session<D: Driver> {
    /// `None` once settled. NOTE: declared before `turn`, so that when `Drop` has given the
    /// connection back the turn goes on after it.
    conn: Option<Conn<D>>,
    turn: Turn,
    home: Arc<Shared<D>>,
}

impl<D: Driver> Session<D> {
    pub(crate) fn new(conn: Conn<D>, turn: Turn, home: Arc<Shared<D>>) -> Self {
        Self {
            conn: Some(conn),
            turn,
            home,
        }
    }

    /// The connection (until settled, which consumes the session).
    pub(crate) fn conn(&self) -> &Conn<D> {
        self.conn.as_ref().expect("a session is live until settled")
    }

    pub(crate) fn conn_mut(&mut self) -> &mut Conn<D> {
        self.conn.as_mut().expect("a session is live until settled")
    }

    pub(crate) fn turn(&self) -> &Turn {
        &self.turn
    }

    /// The database's target, when the connection is the `WritePool`'s own writer connection
    /// (the one with group commit's shared fsync and the commit hook).
    fn own_target(&self) -> Option<&Target<D>> {
        match self.conn() {
            Conn::Own(_) => self.home.known_target(),
            Conn::Pooled(_) => None,
        }
    }

    /// The commit hook of the write path's connections, if the driver has one: set for good
    /// on the `WritePool`'s own connection, and for the transaction only on one of the
    /// pool's (`gate.rs`).
    pub(crate) fn gate(&self) -> Option<&Arc<CommitGate>> {
        self.home.known_target()?.gate.as_ref()
    }

    /// Whether the connection is one of the pool's (it goes back to the pool).
    pub(crate) fn is_pooled(&self) -> bool {
        matches!(self.conn(), Conn::Pooled(_))
    }

    /// Group commit's shared fsync, if the connection is the `WritePool`'s own and has one.
    pub(crate) fn syncs(&self) -> Option<&Arc<Syncs<D>>> {
        self.own_target()?.syncs.as_ref()
    }

    /// The background checkpointer, if the connection is the `WritePool`'s own and it took
    /// the connection's checkpoints over.
    pub(crate) fn checkpoints(&self) -> Option<&Arc<Checkpoints<D>>> {
        self.own_target()?.checkpoints.as_ref()
    }

    /// Rolls back every level still open (acknowledged); whether the connection is at depth 0.
    pub(crate) async fn roll_back_all(&mut self) -> bool {
        let conn = self.conn_mut();
        for _ in 0..MAX_DEPTH {
            if D::depth(conn) == 0 {
                return true;
            }
            if D::rollback(conn).await.is_err() {
                return false;
            }
        }
        D::depth(conn) == 0
    }

    /// The connection's commit hook as the transaction's end leaves it (`gate.rs`): the gate
    /// set again on the `WritePool`'s own connection, if it has one; no hook at all on one of
    /// the pool's, which goes back as it came (the gate is the write path's, and so is a hook
    /// a handler set on its transaction's connection). Whether it was done (a connection
    /// whose hook could not be set or removed is not clean).
    pub(crate) async fn guard_again(&mut self, gate: Option<&Arc<CommitGate>>) -> bool {
        if self.is_pooled() {
            return D::unguard_commits(self.conn_mut()).await.is_ok();
        }
        match gate {
            Some(gate) => D::guard_commits(self.conn_mut(), Arc::clone(gate))
                .await
                .is_ok(),
            None => true,
        }
    }

    /// Sets the gate on one of the pool's connections for this transaction (the
    /// `WritePool`'s own has it for good): `Err` if it could not be set.
    pub(crate) async fn guard_pooled(&mut self) -> Result<(), D::Error> {
        if !self.is_pooled() {
            return Ok(());
        }
        match self.gate().cloned() {
            Some(gate) => D::guard_commits(self.conn_mut(), gate).await.map(drop),
            None => Ok(()),
        }
    }

    /// The outcome is known: the connection goes back (if `clean` and at depth 0; given up
    /// otherwise), then the turn goes on.
    pub(crate) fn settle(mut self, clean: bool) {
        self.give_back(clean);
    }

    /// Dropped while its transaction may be open: sqlx's `Transaction::drop`, then its pool's
    /// release (see the module docs). Nobody waits for the outcome.
    pub(crate) fn abandon(mut self) {
        D::start_rollback(self.conn_mut());
        self.turn.release_request();
        let bound = bound(None, D::acquire_timeout(&self.home.pool));
        // NOTE: the session moves into the task: a task that never runs, or is dropped midway,
        // drops it, which settles it as not clean.
        D::spawn(async move {
            let gate = self.gate().cloned();
            let settled = async {
                D::ping(self.conn_mut()).await.is_ok()
                    && self.roll_back_all().await
                    && self.guard_again(gate.as_ref()).await
            };
            let clean = within(bound, settled).await == Some(true);
            self.settle(clean);
        });
    }

    fn give_back(&mut self, clean: bool) {
        if let Some(conn) = self.conn.take() {
            self.home.give_back(conn, clean);
        }
    }
}

impl<D: Driver> Drop for Session<D> {
    /// Settles as not clean, if nothing settled it (the turn goes on after, as the field
    /// dropped next).
    fn drop(&mut self) {
        self.give_back(false);
    }
}
