//! The bounds every number a session asks for must keep (`POST /v1/sessions`).
//!
//! Budgets are subtracted from, added to and carved out of each other: a negative budget
//! handed to a child would *add* to what its parent has left, a NaN compares false with
//! everything, and a value near the top of its type overflows the sums the meter and Cedar
//! make (`context.session.cost + context.impact.cost`). So every number is checked here,
//! before anything is carved or stored, and one out of bounds is a `400 bad_request` naming
//! the field. JSON itself cannot carry NaN or infinity, and serde refuses negative or
//! fractional counts; what is left to refuse is a negative, non-finite or absurd cost and
//! counts beyond any real session.

use super::registry::NewSession;

/// The most tool calls one session may be given: far beyond any real run, far below any
/// overflow.
pub const MAX_CALLS: u64 = 1_000_000_000_000;
/// The largest cost budget, in the catalog's currency: the bound the catalog puts on one
/// tool's `cost` too, so micro-units stay exact and every sum fits an `i64`.
pub const MAX_COST: f64 = 1e12;
/// The largest byte budget either way (1 PiB).
pub const MAX_BYTES: u64 = 1 << 50;

/// Why a number of a new session is refused: the field and the bound, never more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must be {bound}")]
pub struct OutOfBounds {
    pub field: &'static str,
    pub bound: String,
}

/// Check every number `new` names.
pub fn check(new: &NewSession) -> Result<(), OutOfBounds> {
    if let Some(calls) = new.max_calls {
        within("max_calls", calls, MAX_CALLS)?;
    }
    if let Some(cost) = new.max_cost {
        if !(cost.is_finite() && (0.0..=MAX_COST).contains(&cost)) {
            return Err(OutOfBounds {
                field: "max_cost",
                bound: format!("a finite number between 0 and {MAX_COST:e}"),
            });
        }
    }
    for (field, bytes) in [
        ("max_bytes_sent", new.max_bytes_sent),
        ("max_bytes_received", new.max_bytes_received),
    ] {
        if let Some(bytes) = bytes {
            within(field, bytes, MAX_BYTES)?;
        }
    }
    Ok(())
}

fn within(field: &'static str, value: u64, max: u64) -> Result<(), OutOfBounds> {
    if value > max {
        return Err(OutOfBounds {
            field,
            bound: format!("at most {max}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut NewSession)) -> Result<(), OutOfBounds> {
        let mut new = NewSession::default();
        f(&mut new);
        check(&new)
    }

    #[test]
    fn numbers_out_of_bounds_are_refused_by_name() {
        assert!(with(|_| {}).is_ok());
        assert!(with(|n| n.max_cost = Some(0.0)).is_ok());
        assert!(with(|n| n.max_cost = Some(MAX_COST)).is_ok());
        assert!(with(|n| n.max_calls = Some(0)).is_ok());
        for cost in [
            -1e6,
            -0.000_001,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e13,
            1e308,
        ] {
            let err = with(|n| n.max_cost = Some(cost)).unwrap_err();
            assert_eq!(err.field, "max_cost", "{cost}");
        }
        assert_eq!(
            with(|n| n.max_calls = Some(u64::MAX)).unwrap_err().field,
            "max_calls"
        );
        assert_eq!(
            with(|n| n.max_bytes_sent = Some(MAX_BYTES + 1))
                .unwrap_err()
                .field,
            "max_bytes_sent"
        );
        assert_eq!(
            with(|n| n.max_bytes_received = Some(u64::MAX))
                .unwrap_err()
                .field,
            "max_bytes_received"
        );
    }
}
