//! A private RabbitMQ cluster, for tests of a broker that loses a node.
//!
//! [`OwnBrokerCluster::start`] starts [`OwnBroker`] nodes sharing one Erlang cookie and joins
//! every node to the first (`stop_app`, `join_cluster`, `start_app`). Quorum queues declared
//! afterwards get a member on every node; clients connect to the first node, which also runs
//! the management API, so a test can kill any other node under them.

use crate::OwnBroker;

/// The nodes of one cluster; dropping it kills them all and deletes their dirs.
#[derive(Debug)]
pub struct OwnBrokerCluster {
    nodes: Vec<OwnBroker>,
}

impl OwnBrokerCluster {
    /// Starts `size` (at least 1) nodes and clusters them. Panics with a node's log tail if
    /// one does not come up or join within a minute.
    pub async fn start(size: usize) -> Self {
        let cookie = uuid::Uuid::new_v4().simple().to_string().to_uppercase();
        let mut nodes = vec![OwnBroker::start_node(true, Some(&cookie)).await];
        for _ in 1..size.max(1) {
            nodes.push(OwnBroker::start_node(false, Some(&cookie)).await);
        }
        let seed = nodes[0].node_name().to_string();
        for node in &nodes[1..] {
            node.ctl(&["stop_app"]).await;
            node.ctl(&["join_cluster", &seed]).await;
            node.ctl(&["start_app"]).await;
            node.wait_accepting().await;
        }
        Self { nodes }
    }

    /// Node `index` (0 is the one clients and the management API use).
    pub fn node(&self, index: usize) -> &OwnBroker {
        &self.nodes[index]
    }

    /// The index of the node leading quorum queue `queue` (vhost `/`), if it has a leader.
    pub async fn leader_of(&self, queue: &str) -> Option<usize> {
        let listing = self.nodes[0]
            .cli(
                "rabbitmqctl",
                &["list_queues", "-q", "--no-table-headers", "name", "leader"],
            )
            .await;
        let leader = listing.lines().find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next() == Some(queue)).then(|| fields.next().unwrap_or("").to_string())
        })?;
        self.nodes.iter().position(|n| n.node_name() == leader)
    }

    /// Makes sure quorum queue `queue` is not led by node 0 (the one clients use): if it is,
    /// its member there is removed, which hands the leadership to another member, and added
    /// back as a follower. Returns the index of the node leading it then.
    pub async fn move_leader_off_first_node(&self, queue: &str) -> usize {
        let first = self.nodes[0].node_name().to_string();
        if self.leader_of(queue).await == Some(0) {
            for step in ["delete_member", "add_member"] {
                self.nodes[0]
                    .cli("rabbitmq-queues", &[step, "--vhost", "/", queue, &first])
                    .await;
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            match self.leader_of(queue).await {
                Some(leader) if leader != 0 => return leader,
                _ if std::time::Instant::now() >= deadline => {
                    panic!("{queue} has no leader off the first node after 60 s")
                }
                _ => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
            }
        }
    }
}
