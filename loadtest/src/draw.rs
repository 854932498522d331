//! A raffle audited from outside (`--waiting-room raffle`): what the room published before
//! its start (the seed's commitment) and after (the seed, the entries, the ticket list), and
//! the order of admission re-derived from them as DESIGN.md §9 defines it — written here
//! from that contract, not from the gateway's code, so the check is the one any buyer could
//! make.

use anyhow::Context;
use reqwest::{Client, header::AUTHORIZATION};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// `GET /api/rooms/{id}/draw`'s answer.
#[derive(Debug, Clone, Deserialize)]
pub struct Published {
    /// SHA-256 of the seed, hex.
    pub commitment: String,
    /// Once entry closed: how many places were drawn.
    #[serde(default)]
    pub entries: Option<u64>,
    /// Once entry closed: the seed.
    #[serde(default)]
    pub seed: Option<String>,
    /// Once entry closed: the user of each entry, by place.
    #[serde(default)]
    pub tickets: Option<Vec<i64>>,
}

/// Reads the draw of `product_id`'s room through the gateway at `base`.
pub async fn fetch(
    client: &Client,
    base: &str,
    product_id: i64,
    authorization: &str,
) -> anyhow::Result<Published> {
    let response = client
        .get(format!("{base}/api/rooms/{product_id}/draw"))
        .header(AUTHORIZATION, authorization)
        .send()
        .await
        .context("read the draw")?;
    let status = response.status();
    let body = response.bytes().await.context("read the draw's body")?;
    anyhow::ensure!(
        status.is_success(),
        "the draw answered {status}: {}",
        String::from_utf8_lossy(&body)
    );
    serde_json::from_slice(&body).context("the draw's answer")
}

/// The rank of each place `0..entries` under `seed`: the places sorted by SHA-256 of
/// `seed:place`, each place's index in that order.
pub fn ranks(seed: &str, entries: u64) -> Vec<u64> {
    let mut keyed: Vec<([u8; 32], u64)> = (0..entries)
        .map(|place| {
            let digest: [u8; 32] = Sha256::digest(format!("{seed}:{place}")).into();
            (digest, place)
        })
        .collect();
    keyed.sort();
    let mut ranks = vec![0; keyed.len()];
    for (rank, (_, place)) in keyed.into_iter().enumerate() {
        ranks[place as usize] = rank as u64;
    }
    ranks
}

/// The audit of a closed draw against the commitment read before the start: the rank of
/// each place (later places keep theirs), or what does not hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Audit {
    /// Rank by place for the entries.
    pub ranks: Vec<u64>,
    /// The ticket list, by place.
    pub tickets: Vec<i64>,
}

impl Audit {
    /// Checks `published` (read after the start) against `commitment` (read before it).
    pub fn new(commitment: &str, published: &Published) -> Result<Self, String> {
        let (Some(seed), Some(entries), Some(tickets)) = (
            published.seed.as_deref(),
            published.entries,
            published.tickets.clone(),
        ) else {
            return Err("the draw was not published after the start".into());
        };
        let digest = Sha256::digest(seed.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        if hex != commitment || published.commitment != commitment {
            return Err(format!(
                "the seed revealed ({hex}) is not the one committed to before the start \
                 ({commitment})"
            ));
        }
        if tickets.len() as u64 != entries {
            return Err(format!(
                "{} tickets listed for {entries} entries",
                tickets.len()
            ));
        }
        Ok(Self {
            ranks: ranks(seed, entries),
            tickets,
        })
    }

    /// The rank of `place`.
    pub fn rank(&self, place: u64) -> u64 {
        self.ranks.get(place as usize).copied().unwrap_or(place)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published(seed: &str, entries: u64) -> Published {
        Published {
            commitment: Sha256::digest(seed.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            entries: Some(entries),
            seed: Some(seed.into()),
            tickets: Some((0..entries as i64).collect()),
        }
    }

    #[test]
    fn the_ranks_are_a_permutation_in_key_order() {
        let ranks = ranks("seed", 50);
        let mut sorted = ranks.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        let first = ranks.iter().position(|&r| r == 0).unwrap() as u64;
        let second = ranks.iter().position(|&r| r == 1).unwrap() as u64;
        assert!(Sha256::digest(format!("seed:{first}")) < Sha256::digest(format!("seed:{second}")));
    }

    #[test]
    fn a_seed_other_than_the_committed_one_fails_the_audit() {
        let honest = published("seed", 10);
        let audit = Audit::new(&honest.commitment, &honest).expect("honest");
        assert_eq!(audit.rank(12), 12, "a late joiner keeps its place");
        let mut swapped = honest.clone();
        swapped.seed = Some("other".into());
        assert!(Audit::new(&honest.commitment, &swapped).is_err());
        let mut short = honest.clone();
        short.tickets = Some(vec![1, 2]);
        assert!(Audit::new(&honest.commitment, &short).is_err());
        let mut unrevealed = honest.clone();
        unrevealed.seed = None;
        assert!(Audit::new(&honest.commitment, &unrevealed).is_err());
    }
}
