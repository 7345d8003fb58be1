//! Calling every node at once.
//!
//! Redlock's safety argument measures one attempt from its first request to its last reply; calling the
//! nodes one after another would add their latencies (and their timeouts) to that time and shrink the
//! validity. So each call goes to all nodes in parallel, on scoped threads, and costs the slowest
//! node's round trip, bounded by the node timeout. The calling thread serves one of the nodes itself, so
//! N nodes cost N - 1 threads, and a single node costs none.

use std::thread;

use super::node::Node;

/// The quorum of `n` nodes: a majority.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// Runs `f` on every node selected by `pick`, all in parallel; `None` for the others.
pub fn each<T: Send>(
    nodes: &mut [Node],
    pick: impl Fn(usize) -> bool,
    f: impl Fn(usize, &mut Node) -> T + Sync,
) -> Vec<Option<T>> {
    let picked = (0..nodes.len()).filter(|&i| pick(i)).count();
    if picked <= 1 {
        return nodes
            .iter_mut()
            .enumerate()
            .map(|(i, n)| pick(i).then(|| f(i, n)))
            .collect();
    }
    // The first picked node is served by the calling thread itself, after the others are spawned:
    // one thread fewer to create and join per operation.
    let first = (0..nodes.len()).find(|&i| pick(i));
    let f = &f;
    thread::scope(|s| {
        let slots: Vec<_> = nodes
            .iter_mut()
            .enumerate()
            .map(|(i, n)| match (pick(i), Some(i) == first) {
                (false, _) => Slot::Skip,
                (true, true) => Slot::Inline(n),
                (true, false) => Slot::Spawned(s.spawn(move || f(i, n))),
            })
            .collect();
        slots
            .into_iter()
            .enumerate()
            .map(|(i, slot)| match slot {
                Slot::Skip => None,
                Slot::Inline(n) => Some(f(i, n)),
                Slot::Spawned(h) => Some(h.join().expect("node thread panicked")),
            })
            .collect()
    })
}

enum Slot<'a, 's, T> {
    Skip,
    Inline(&'a mut Node),
    Spawned(thread::ScopedJoinHandle<'s, T>),
}

/// Runs `f` on every node, all in parallel.
pub fn all<T: Send>(nodes: &mut [Node], f: impl Fn(usize, &mut Node) -> T + Sync) -> Vec<T> {
    each(nodes, |_| true, f)
        .into_iter()
        .map(|r| r.expect("every node picked"))
        .collect()
}
