//! A standalone master: `redis://`, `rediss://`, `unix://`.
//!
//! On failover it promises nothing by itself: there is no one to ask for a new master, so a replica
//! where the URL pointed (`READONLY`, or `INFO` saying `role:slave`) is refused with exit
//! 78 and the advice to use the master or a `redis+sentinel://` URL. A master with replicas gets each
//! grant and renewal confirmed by `WAIT` all the same, so a failover that someone else runs (an
//! operator, a managed service moving the address) promotes a replica that holds the lock.
//!
//! A node of a Redis Cluster named this way is found out by its first MOVED reply and followed from
//! then on, like a `redis+cluster://` URL with one seed; `INFO` (`cluster_enabled`) tells a cluster
//! replica (which redirects) from a standalone one (which is refused). When the server a redirect
//! pointed at cannot be reached, the URL's own server is asked again, which names the slot's new
//! owner after a failover.

use redis::Client;

/// The server of the URL, and the one a MOVED reply pointed at since.
pub struct Standalone {
    pub(super) own: Client,
    pub(super) current: Client,
}

impl Standalone {
    pub fn new(client: &Client) -> Standalone {
        Standalone {
            own: client.clone(),
            current: client.clone(),
        }
    }
}
