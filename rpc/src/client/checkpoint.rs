//! Checkpoint compare-and-set: save if newer, load.

use baton_statemachine::checkpoint::Checkpoint;

use super::Client;
use crate::error::Error;
use crate::proto;
use crate::proto::checkpoint_client::CheckpointClient;

impl Client {
    /// Stores `data` for `run` if `seq` is above the stored seq: `StaleSeq` otherwise (nothing
    /// written); `seq == 0` is `Invalid`.
    pub async fn save_if_newer(&self, run: &str, seq: u64, data: &[u8]) -> Result<(), Error> {
        self.write(|header, channel| {
            let request = proto::SaveIfNewerRequest {
                header: Some(header),
                run: run.to_string(),
                seq,
                data: data.to_vec(),
            };
            async move { CheckpointClient::new(channel).save_if_newer(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Linearizable read of `run`'s latest checkpoint (`NotFound` when nothing was saved, never
    /// an empty value).
    pub async fn load(&self, run: &str) -> Result<Checkpoint, Error> {
        let reply = self
            .call(|channel| {
                let request = proto::LoadCheckpointRequest {
                    run: run.to_string(),
                };
                async move { CheckpointClient::new(channel).load(request).await }
            })
            .await?;
        // Every save has a seq above 0; nothing saved is NOT_FOUND, never an empty checkpoint.
        if reply.seq == 0 {
            return Err(Error::Protocol(format!(
                "load answered a checkpoint of {run} with seq 0"
            )));
        }
        Ok(Checkpoint {
            seq: reply.seq,
            data: reply.data,
            saved_at_ms: reply.saved_at_ms,
        })
    }
}
