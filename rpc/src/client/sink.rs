//! The fenced sink: fenced writes and linearizable reads.

use baton_statemachine::sink::SinkValue;
use baton_statemachine::Refusal;

use super::Client;
use crate::error::Error;
use crate::proto;
use crate::proto::sink_client::SinkClient;

impl Client {
    /// Writes `value` to `resource` presenting `fence`: refused `FenceStale` (nothing written)
    /// when a higher fence was seen; an equal fence is allowed. Returns the resource after the
    /// write.
    pub async fn write_fenced(
        &self,
        resource: &str,
        fence: u64,
        value: &[u8],
    ) -> Result<SinkValue, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::SinkWriteRequest {
                    header: Some(header),
                    resource: resource.to_string(),
                    fence,
                    value: value.to_vec(),
                };
                async move { SinkClient::new(channel).write(request).await }
            })
            .await?;
        Ok(SinkValue {
            seen_fence: reply.seen_fence,
            value: value.to_vec(),
            writes: reply.writes,
        })
    }

    /// Linearizable read of a resource (`NotFound` when it was never written).
    pub async fn read_sink(&self, resource: &str) -> Result<SinkValue, Error> {
        let reply = self
            .call(|channel| {
                let request = proto::SinkReadRequest {
                    resource: resource.to_string(),
                };
                async move { SinkClient::new(channel).read(request).await }
            })
            .await?;
        Ok(SinkValue {
            seen_fence: reply.seen_fence,
            value: reply.value,
            writes: reply.writes,
        })
    }

    /// The highest fence `resource` has accepted (0 if it was never written).
    pub async fn seen_fence(&self, resource: &str) -> Result<u64, Error> {
        match self.read_sink(resource).await {
            Ok(value) => Ok(value.seen_fence),
            Err(Error::Refused(Refusal::NotFound)) => Ok(0),
            Err(error) => Err(error),
        }
    }
}
