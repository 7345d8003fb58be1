//! A Redis Cluster: `redis+cluster://HOST:PORT[,HOST:PORT...]` (or any node named by `redis://`).
//!
//! Every key of one lock lives in the lock key's hash slot, so one lock is one master: a command goes
//! to the current node, and a MOVED reply (the slot lives elsewhere, or a failover moved it) makes its
//! address the current node for the rest of the run; an ASK reply (the slot is being migrated) sends
//! that one command, after ASKING, to the node named. Both are followed within the node timeout, for
//! at most [`MAX_REDIRECTS`] hops. When the current node cannot be reached, the next seed is asked,
//! which redirects to the slot's owner once the cluster has promoted a replica.
//!
//! On failover: each grant and renewal is confirmed by `WAIT` on the slot's master, so the replica that
//! `CLUSTER FAILOVER` or a crash promotes holds the lock; a holder's next renewal gets MOVED from the
//! demoted master (now a replica) and follows it to the new one. What remains possible is in
//! `docs/topologies.md`.

use redis::Client;

/// Redirects followed for one command before giving up (a slot migrating back and forth, a
/// misconfigured cluster that points in a circle).
pub const MAX_REDIRECTS: usize = 5;

/// The seeds and the node the slot was last found on.
pub struct Cluster {
    seeds: Vec<Client>,
    seed: usize,
    current: Client,
}

impl Cluster {
    /// `seeds`: one client per seed, the first the URL's; never empty.
    pub fn new(seeds: Vec<Client>) -> Cluster {
        Cluster {
            current: seeds[0].clone(),
            seeds,
            seed: 0,
        }
    }

    pub fn current(&self) -> Client {
        self.current.clone()
    }

    pub(super) fn current_ref(&self) -> &Client {
        &self.current
    }

    pub(super) fn own(&self) -> &Client {
        &self.seeds[0]
    }

    pub fn moved(&mut self, to: Client) {
        self.current = to;
    }

    /// The current node failed: start again from the next seed.
    pub fn next_seed(&mut self) {
        self.seed = (self.seed + 1) % self.seeds.len();
        self.current = self.seeds[self.seed].clone();
    }

    /// Every seed's client.
    pub fn seeds(&self) -> &[Client] {
        &self.seeds
    }
}
