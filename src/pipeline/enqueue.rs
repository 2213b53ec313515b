//! Batch mode's dealings with the service besides collection: uploading the
//! prepared request files, creating their batches, and adopting the job's
//! own batches whose creation a killed run never recorded.
//!
//! Every batch carries the job's fingerprint and its part number in its
//! metadata. A part uploaded but without a batch id may have a batch on the
//! service (created, then the run was killed, or the answer was lost): the
//! listing is read for it before anything is created, and `create_batch` is
//! never sent again blindly after an error that may have created one.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::RunError;
use crate::backend::api::BatchService;
use crate::client::NewBatch;
use crate::state::batches::{requests_path, BatchRecord, PartState};
use crate::state::Fingerprint;

const JOB_KEY: &str = "embedjob_job";
const FINGERPRINT_KEY: &str = "embedjob_fingerprint";
const PART_KEY: &str = "embedjob_part";
/// OpenAI's longest metadata value.
const MAX_VALUE_CHARS: usize = 512;
/// Batches are listed this many at a time.
const PAGE: u32 = 100;
/// Files are listed this many at a time.
const FILE_PAGE: u32 = 1000;
/// Slack for clocks that differ between here and the service, in seconds.
const CLOCK_SLACK: u64 = 3600;

/// What tags a job's batches.
pub(super) struct Tag {
    pub job: String,
    /// SHA-256 of the fingerprint, in hex.
    pub fingerprint: String,
}

impl Tag {
    pub(super) fn new(job: &str, fingerprint: &Fingerprint) -> Tag {
        Tag {
            job: job.chars().take(MAX_VALUE_CHARS).collect(),
            fingerprint: hex::encode(Sha256::digest(fingerprint.to_json().as_bytes())),
        }
    }

    fn metadata(&self, part: u64) -> BTreeMap<String, String> {
        BTreeMap::from([
            (JOB_KEY.to_string(), self.job.clone()),
            (FINGERPRINT_KEY.to_string(), self.fingerprint.clone()),
            (PART_KEY.to_string(), part.to_string()),
        ])
    }

    fn filename(&self, part: u64) -> String {
        format!("embedjob-{}-{part}.jsonl", &self.fingerprint[..12])
    }
}

/// What sending did.
#[derive(Debug, Default)]
pub(super) struct Sent {
    pub created: u64,
    pub adopted: u64,
    pub warnings: Vec<String>,
}

/// Adopts, for each part uploaded without a batch id, the batch of this
/// job's fingerprint and that part number the service lists. Batches of
/// another fingerprint are never touched.
pub(super) async fn adopt(
    service: &BatchService,
    tag: &Tag,
    dir: &Path,
    record: &mut BatchRecord,
) -> Result<u64, RunError> {
    let waiting: Vec<(u64, u64)> = record
        .parts
        .iter()
        .filter(|p| p.state == PartState::Uploaded)
        .map(|p| (p.number, p.prepared_at))
        .collect();
    let Some(oldest) = waiting.iter().map(|w| w.1).min() else {
        return Ok(0);
    };
    let mut adopted = 0;
    let mut after: Option<String> = None;
    loop {
        let page = service
            .client
            .batches(after.as_deref(), PAGE)
            .await
            .map_err(|e| RunError::Internal(format!("cannot list the service's batches: {e}")))?;
        let mut older = false;
        for batch in &page.data {
            older |= batch.created_at.saturating_add(CLOCK_SLACK) < oldest;
            if batch.metadata.get(FINGERPRINT_KEY) != Some(&tag.fingerprint) {
                continue;
            }
            let Some(number) = batch
                .metadata
                .get(PART_KEY)
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            // Its own upload too: a part number may come again after the
            // checkpoint was discarded, a file id never does.
            if let Some(part) = record.part_mut(number).filter(|p| {
                p.state == PartState::Uploaded
                    && p.file_id.as_deref() == Some(batch.input_file_id.as_str())
            }) {
                part.batch_id = Some(batch.id.clone());
                part.expires_at = batch.expires_at;
                part.status = Some(batch.status.as_str().to_string());
                part.state = PartState::Submitted;
                adopted += 1;
            }
        }
        // Newest first: once past the oldest part waiting, nothing older is ours.
        if older || !page.has_more || page.last_id.is_none() || page.data.is_empty() {
            break;
        }
        after = page.last_id;
    }
    if adopted > 0 {
        record.save(dir)?;
    }
    Ok(adopted)
}

/// Deletes, for each part prepared but without a file id, the request
/// files this job uploaded for it (found by their name: an upload whose
/// answer was lost, or a run killed before it recorded the id), so that its
/// upload leaves no duplicate behind. No batch was created from them: a batch
/// is created only from a recorded file id. Returns how many were deleted.
pub(super) async fn forget_lost_uploads(
    service: &BatchService,
    tag: &Tag,
    record: &BatchRecord,
) -> Result<u64, RunError> {
    let lost: HashMap<String, u64> = record
        .parts
        .iter()
        .filter(|p| p.state == PartState::Prepared && p.file_id.is_none())
        .map(|p| (tag.filename(p.number), p.prepared_at))
        .collect();
    let Some(oldest) = lost.values().min().copied() else {
        return Ok(0);
    };
    let listing_failed =
        |e| RunError::Internal(format!("cannot list the service's batch files: {e}"));
    let mut ours = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = service
            .client
            .files("batch", after.as_deref(), FILE_PAGE)
            .await
            .map_err(listing_failed)?;
        let mut older = false;
        for file in &page.data {
            // A service that gives no time lists all: nothing is taken as older.
            older |= file.created_at > 0 && file.created_at.saturating_add(CLOCK_SLACK) < oldest;
            if lost.contains_key(&file.filename) {
                ours.push(file.id.clone());
            }
        }
        if older || !page.has_more || page.last_id.is_none() || page.data.is_empty() {
            break;
        }
        after = page.last_id;
    }
    for id in &ours {
        service
            .client
            .delete_file(id)
            .await
            .map_err(|e| RunError::Internal(format!("cannot delete the lost upload {id}: {e}")))?;
    }
    Ok(ours.len() as u64)
}

/// Uploads the prepared parts and creates their batches, recording each
/// file id and batch id as soon as the service gives it.
pub(super) async fn send(
    service: &BatchService,
    tag: &Tag,
    dir: &Path,
    record: &mut BatchRecord,
) -> Result<Sent, RunError> {
    let mut sent = Sent {
        adopted: adopt(service, tag, dir, record).await?,
        ..Sent::default()
    };
    let numbers: Vec<u64> = record
        .parts
        .iter()
        .filter(|p| matches!(p.state, PartState::Prepared | PartState::Uploaded))
        .map(|p| p.number)
        .collect();
    for number in numbers {
        if record
            .part_mut(number)
            .is_some_and(|p| p.state == PartState::Prepared)
        {
            let path = requests_path(dir, number);
            let file = match service
                .client
                .upload_batch_file(&path, &tag.filename(number))
                .await
            {
                Ok(file) => file,
                Err(e) if e.is_transient() || e.status.is_none_or(|s| s >= 500) => {
                    // It may be stored: found by its name and deleted, now or by the next run.
                    let _ = forget_lost_uploads(service, tag, record).await;
                    sent.warnings.push(format!(
                        "uploading {} failed ({e}); the next run uploads it again",
                        path.display()
                    ));
                    break;
                }
                Err(e) => {
                    return Err(RunError::Internal(format!(
                        "cannot upload {}: {e}",
                        path.display()
                    )))
                }
            };
            if let Some(part) = record.part_mut(number) {
                part.file_id = Some(file.id);
                part.state = PartState::Uploaded;
            }
            record.save(dir)?;
        }
        let Some(file_id) = record.part_mut(number).and_then(|p| p.file_id.clone()) else {
            continue;
        };
        let metadata = tag.metadata(number);
        let new = NewBatch {
            input_file_id: &file_id,
            endpoint: "/v1/embeddings",
            completion_window: &service.completion_window,
            metadata: &metadata,
        };
        match service.client.create_batch(&new).await {
            Ok(batch) => {
                if let Some(part) = record.part_mut(number) {
                    part.batch_id = Some(batch.id);
                    part.expires_at = batch.expires_at;
                    part.status = Some(batch.status.as_str().to_string());
                    part.state = PartState::Submitted;
                }
                record.save(dir)?;
                sent.created += 1;
            }
            Err(e) if e.is_transient() || e.status.is_none_or(|s| s >= 500) => {
                // It may have been created: the listing tells, never a second create.
                sent.adopted += adopt(service, tag, dir, record).await?;
                if record
                    .part_mut(number)
                    .is_some_and(|p| p.state == PartState::Uploaded)
                {
                    sent.warnings.push(format!(
                        "creating the batch of part {number} failed ({e}); the next run \
                         looks for it on the service before creating it"
                    ));
                    break;
                }
            }
            Err(e) => {
                return Err(RunError::Internal(format!(
                    "the service refused the batch of part {number}: {e}"
                )))
            }
        }
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_names_the_fingerprint_and_part() {
        let fingerprint = Fingerprint::from_json(r#"{"backend.model":"m"}"#).unwrap();
        let tag = Tag::new("docs", &fingerprint);
        let other = Tag::new(
            "docs",
            &Fingerprint::from_json(r#"{"backend.model":"n"}"#).unwrap(),
        );
        assert_ne!(tag.fingerprint, other.fingerprint);
        let metadata = tag.metadata(7);
        assert_eq!(metadata[PART_KEY], "7");
        assert_eq!(metadata[JOB_KEY], "docs");
        assert!(tag
            .filename(7)
            .starts_with(&format!("embedjob-{}", &tag.fingerprint[..12])));
        assert_eq!(Tag::new(&"x".repeat(600), &fingerprint).job.len(), 512);
    }
}
