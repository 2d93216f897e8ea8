//! How much of a buffer's tail could be the beginning of a pattern not yet complete: the
//! bytes a streaming scan must hold back even though its automaton found nothing there.
//! Shared by the response scrubber ([`crate::scrub`]) and outbound DLP
//! ([`crate::check::dlp`]).
//!
//! A trie of the patterns with Aho–Corasick failure links, walked over the last
//! `longest pattern − 1` bytes only (the `aho-corasick` crate does not expose the depth of
//! its states, hence this small companion).

/// The patterns' trie; its only question is [`PrefixTrie::held_suffix`].
#[derive(Debug, Default)]
pub struct PrefixTrie {
    nodes: Vec<Node>,
}

#[derive(Debug, Default)]
struct Node {
    /// Sorted by byte.
    next: Vec<(u8, u32)>,
    fail: u32,
    depth: u32,
}

impl PrefixTrie {
    pub fn new<'a>(patterns: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut nodes = vec![Node::default()];
        for pattern in patterns {
            let mut at = 0usize;
            for &b in pattern {
                at = match nodes[at].next.binary_search_by_key(&b, |&(k, _)| k) {
                    Ok(i) => nodes[at].next[i].1 as usize,
                    Err(i) => {
                        let id = nodes.len();
                        let depth = nodes[at].depth + 1;
                        nodes[at].next.insert(i, (b, id as u32));
                        nodes.push(Node {
                            depth,
                            ..Node::default()
                        });
                        id
                    }
                };
            }
        }
        // Breadth-first, so a node's failure target is final before its children need it.
        let mut queue: std::collections::VecDeque<u32> =
            nodes[0].next.iter().map(|&(_, c)| c).collect();
        while let Some(id) = queue.pop_front() {
            let edges = nodes[id as usize].next.clone();
            for (b, child) in edges {
                let mut f = nodes[id as usize].fail;
                let target = loop {
                    if let Some(t) = step(&nodes, f, b) {
                        break t;
                    }
                    if f == 0 {
                        break 0;
                    }
                    f = nodes[f as usize].fail;
                };
                nodes[child as usize].fail = target;
                queue.push_back(child);
            }
        }
        Self { nodes }
    }

    /// The length of the longest suffix of `window` that is a proper prefix of a pattern
    /// (a prefix some pattern continues beyond).
    pub fn held_suffix<'a>(&self, window: impl IntoIterator<Item = &'a u8>) -> usize {
        let mut at = 0u32;
        for &b in window {
            at = loop {
                if let Some(t) = step(&self.nodes, at, b) {
                    break t;
                }
                if at == 0 {
                    break 0;
                }
                at = self.nodes[at as usize].fail;
            };
        }
        // A complete anchor nothing extends was found by the automaton; shorter suffixes
        // are on the failure chain, longest first.
        while at != 0 && self.nodes[at as usize].next.is_empty() {
            at = self.nodes[at as usize].fail;
        }
        self.nodes[at as usize].depth as usize
    }
}

fn step(nodes: &[Node], at: u32, b: u8) -> Option<u32> {
    let next = &nodes[at as usize].next;
    next.binary_search_by_key(&b, |&(k, _)| k)
        .ok()
        .map(|i| next[i].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_suffix_is_the_longest_proper_prefix() {
        let pats: [&[u8]; 3] = [b"abcd", b"bcx", b"zz"];
        let trie = PrefixTrie::new(pats);
        assert_eq!(trie.held_suffix(b"xxabc"), 3);
        assert_eq!(trie.held_suffix(b"xxbc"), 2);
        assert_eq!(trie.held_suffix(b"xxz"), 1);
        assert_eq!(trie.held_suffix(b"xxq"), 0);
        assert_eq!(trie.held_suffix(b""), 0);
        assert_eq!(trie.held_suffix(b"xzz"), 1);
        assert_eq!(trie.held_suffix(b"abcd"), 0);
    }
}
