//! Teardown news between replicas: the replica that ends a session publishes its id on
//! `<prefix>:teardown`, and every other replica ends what it holds of that session — open
//! tunnels, WebSockets and streams, requests in flight, cached credentials and leases it
//! minted. Pub/sub is fast but not durable (a replica that was disconnected misses news),
//! so the reaper's reconciliation with the store is the backstop
//! ([`crate::lifecycle::Teardown::reconcile`]).

use futures_util::{Stream, StreamExt};

use super::{classify, Counters, CountersError};

/// One piece of news: which replica ended which session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub replica: String,
    pub session: String,
}

impl Counters {
    fn channel(&self) -> String {
        format!("{}:teardown", self.prefix)
    }

    /// Tell the other replicas that `replica` ended `session`.
    pub async fn publish_ended(&self, replica: &str, session: &str) -> Result<(), CountersError> {
        let result = async {
            let mut conn = self.conn().await?;
            redis::cmd("PUBLISH")
                .arg(self.channel())
                .arg(format!("{replica} {session}"))
                .query_async::<i64>(&mut conn)
                .await
                .map_err(classify)
        }
        .await;
        self.health.observe(&result);
        result.map(drop)
    }

    /// The news of sessions other replicas end, until the connection drops (then the
    /// stream ends, and the caller subscribes again).
    pub async fn follow_ended(
        &self,
    ) -> Result<impl Stream<Item = Ended> + Send + 'static, CountersError> {
        let mut pubsub = self.client.get_async_pubsub().await.map_err(classify)?;
        pubsub.subscribe(self.channel()).await.map_err(classify)?;
        Ok(pubsub.into_on_message().filter_map(|msg| async move {
            let text: String = msg.get_payload().ok()?;
            let (replica, session) = text.split_once(' ')?;
            Some(Ended {
                replica: replica.to_owned(),
                session: session.to_owned(),
            })
        }))
    }
}
