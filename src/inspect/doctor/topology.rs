//! doctor's topology report: what stands behind each `-r`, and whether two of them are one.
//!
//! A standalone server, a Redis Cluster (with its masters, each then checked like a node of its own),
//! or a Sentinel-managed master (with the address Sentinel gives and its replicas). Two `-r` that
//! reach one cluster are one vote counted twice: a failure.

use super::{Finding, Level, Probe};
use crate::lock::node::Node;

/// What one `-r` reaches.
pub struct Shard {
    node: String,
    kind: &'static str,
    target: String,
    /// The masters' addresses, for a cluster.
    addrs: Vec<String>,
    /// A node per master, for a cluster.
    pub masters: Vec<Node>,
    replicas: Option<usize>,
}

/// Asks each reachable node what stands behind it.
pub fn survey(nodes: &mut [Node], probes: &[Probe]) -> Vec<Shard> {
    nodes
        .iter_mut()
        .zip(probes)
        .filter(|(_, p)| p.unreachable.is_none())
        .map(|(node, p)| {
            let addrs = node.cluster_masters().unwrap_or_default();
            let masters = addrs.iter().filter_map(|a| node.at(a).ok()).collect();
            let (kind, target) = node.topology();
            Shard {
                node: node.display.clone(),
                kind: if addrs.is_empty() { kind } else { "cluster" },
                target,
                addrs,
                masters,
                replicas: p.role.as_ref().map(|r| r.1),
            }
        })
        .collect()
}

pub fn findings(shards: &[Shard]) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in shards {
        let found = match s.kind {
            "cluster" => format!(
                "Redis Cluster with {} master(s): {}; each is checked below",
                s.addrs.len(),
                s.addrs.join(", ")
            ),
            "sentinel" => format!(
                "Sentinel-managed master, now at {} with {} replica(s); grants and renewals wait \
                 for them (WAIT)",
                s.target,
                s.replicas.map_or("?".into(), |r| r.to_string())
            ),
            _ => format!("standalone server at {}", s.target),
        };
        out.push(Finding {
            node: Some(s.node.clone()),
            check: "topology",
            level: Level::Ok,
            found,
            advice: None,
        });
    }
    for (i, a) in shards.iter().enumerate() {
        for b in &shards[..i] {
            if let Some(shared) = a.addrs.iter().find(|x| b.addrs.contains(x)) {
                out.push(Finding {
                    node: None,
                    check: "independence",
                    level: Level::Fail,
                    found: format!(
                        "{} and {} reach the same cluster (master {shared})",
                        b.node, a.node
                    ),
                    advice: Some(
                        "give each --redis a different, independent cluster or server".into(),
                    ),
                });
            }
        }
    }
    out
}
