//! REST path templates of the catalog (`/repos/{owner}/{repo}/issues`): their checks at load
//! time and how a request's path matches one, as spelled or ignoring case.

use std::collections::HashSet;

use crate::args;

/// A REST path template: `/repos/{owner}/{repo}/issues`. A `{param}` fills a whole segment
/// and its value becomes `args.<param>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTemplate {
    text: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param(String),
}

impl PathTemplate {
    /// Parse and check a template: it starts with `/`, holds no query or fragment, and each
    /// `{...}` is a whole segment naming a distinct identifier. A trailing slash is not part
    /// of a route (`/a/` and `/a` are one route, as most frameworks route them): the proxy
    /// matches paths with a trailing slash trimmed.
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err("must start with `/`".into());
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if text.contains(['?', '#']) {
            return Err("must not hold a query or fragment".into());
        }
        let mut seen = HashSet::new();
        let mut segments = Vec::new();
        for segment in rest.split('/') {
            if let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                if !args::is_identifier(name) {
                    return Err(format!(
                        "parameter {{{name}}} must be an identifier (letters, digits, `_`)"
                    ));
                }
                if !seen.insert(name.to_owned()) {
                    return Err(format!("parameter {{{name}}} appears twice"));
                }
                segments.push(Segment::Param(name.to_owned()));
            } else if segment.contains(['{', '}']) {
                return Err(format!(
                    "segment {segment:?}: a parameter must fill a whole segment (`/{{name}}/`)"
                ));
            } else {
                segments.push(Segment::Literal(segment.to_owned()));
            }
        }
        Ok(Self {
            text: text.to_owned(),
            segments,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The parameter names, in order.
    pub fn params(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Param(name) => Some(name.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// The parameters of `path` (no query) if it matches, segment for segment, one trailing
    /// slash either way. Values are taken as they appear (still percent-encoded); an empty
    /// segment never fills a parameter.
    pub fn captures(&self, path: &str) -> Option<Vec<(String, String)>> {
        let rest = self.matched(path, |lit, part| lit == part)?;
        let params = self.segments.iter().zip(rest.split('/'));
        Some(
            params
                .filter_map(|(segment, part)| match segment {
                    Segment::Param(name) => Some((name.clone(), part.to_owned())),
                    Segment::Literal(_) => None,
                })
                .collect(),
        )
    }

    /// Whether `path` matches with its literal segments compared ignoring ASCII case: the
    /// route an upstream that routes case-insensitively (Express and ASP.NET Core by
    /// default) takes for it.
    pub fn matches_ignoring_case(&self, path: &str) -> bool {
        self.matched(path, |lit, part| lit.eq_ignore_ascii_case(part))
            .is_some()
    }

    /// `path` without its leading and one trailing slash, if its segments match the
    /// template's, literals compared by `same`.
    fn matched<'p>(&self, path: &'p str, same: impl Fn(&str, &str) -> bool) -> Option<&'p str> {
        let path = match path.strip_suffix('/') {
            Some(trimmed) if !trimmed.is_empty() => trimmed,
            _ => path,
        };
        let rest = path.strip_prefix('/')?;
        // Every route of the catalog is tried against every request's path: nothing is
        // allocated until the path has matched.
        let parts = || rest.split('/');
        let matches = parts().count() == self.segments.len()
            && self
                .segments
                .iter()
                .zip(parts())
                .all(|(segment, part)| match segment {
                    Segment::Literal(lit) => same(lit, part),
                    Segment::Param(_) => !part.is_empty(),
                });
        matches.then_some(rest)
    }
}
