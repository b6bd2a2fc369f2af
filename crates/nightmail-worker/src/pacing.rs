//! How fast a model has answered lately, and what that says about a question's wait: the
//! acknowledgement's estimate and the `status` reply's figures. Read from the store's indexes
//! (a model's last answers, the jobs ahead), never from every job it holds.

use std::time::Duration;

use nightmail_store::{Answered, Job, JobState, Store, StoreError};
use nightmail_types::Address;

/// Answers the pace is taken over.
const RECENT: usize = 5;

/// How fast a model has answered lately: seconds per generated token and tokens per answer, over
/// its last five answers (from the start of the attempt that finished to done).
pub struct Pace {
    pub s_per_token: f64,
    pub tokens_per_answer: f64,
}

impl Pace {
    /// `model`'s pace, if it has answered anything yet.
    pub fn of(store: &Store, model: &Address) -> Result<Option<Pace>, StoreError> {
        Ok(Pace::over(&store.recent_answers(model, RECENT)?))
    }

    fn over(recent: &[Answered]) -> Option<Pace> {
        let tokens: u64 = recent.iter().map(|a| a.tokens).sum();
        (tokens > 0).then(|| Pace {
            s_per_token: recent.iter().map(|a| a.took().as_secs_f64()).sum::<f64>() / tokens as f64,
            tokens_per_answer: tokens as f64 / recent.len() as f64,
        })
    }

    /// A typical answer's time.
    pub fn answer(&self) -> Duration {
        Duration::from_secs_f64(self.s_per_token * self.tokens_per_answer)
    }

    /// What is left of a running job, if it runs to a typical length.
    pub fn rest(&self, job: &Job) -> Duration {
        let so_far = job.progress.as_ref().map_or(0, |p| p.output_tokens + p.reasoning_tokens) as f64;
        Duration::from_secs_f64(self.s_per_token * (self.tokens_per_answer - so_far).max(0.0))
    }
}

/// When a new question should start and how long it should take, as its acknowledgement says:
/// from the jobs queued or running for its model that came before it.
pub fn estimate(store: &Store, job: &Job) -> Result<String, StoreError> {
    let ahead: Vec<Job> =
        store.open_jobs_for(&job.model, job.created_at)?.into_iter().filter(|j| j.id != job.id).collect();
    let count = ahead.len();
    Ok(match Pace::of(store, &job.model)? {
        None if count == 0 => "It is next in the queue.".to_string(),
        None => format!("{count} question(s) are ahead of it; there is no timing yet to estimate from."),
        Some(pace) => {
            let own = pace.answer();
            let wait: Duration = ahead
                .iter()
                .filter_map(|j| match j.state {
                    JobState::Queued { .. } => Some(pace.answer()),
                    JobState::Running { .. } => Some(pace.rest(j)),
                    _ => None,
                })
                .sum();
            let rate = format!("at {:.2} s/token, the pace of recent answers", pace.s_per_token);
            if count == 0 {
                format!("It is next; it should take about {} ({rate}).", human_duration(own))
            } else {
                format!(
                    "{count} question(s) are ahead of it: it should start in about {} and take about {} ({rate}).",
                    human_duration(wait),
                    human_duration(own)
                )
            }
        }
    })
}

pub fn human_duration(d: Duration) -> String {
    match d.as_secs() {
        s if s < 90 => format!("{s} s"),
        s if s < 5400 => format!("{} min", (s + 30) / 60),
        s if s < 172_800 => format!("{:.1} h", s as f64 / 3600.0),
        s => format!("{:.1} days", s as f64 / 86_400.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightmail_types::Timestamp;

    #[test]
    fn the_pace_is_that_of_the_answers_given() {
        let answered =
            |secs: u64, tokens: u64| Answered { started_at: Timestamp(0), at: Timestamp(secs * 1000), tokens };
        assert!(Pace::over(&[]).is_none());
        let pace = Pace::over(&[answered(10, 100), answered(30, 100)]).unwrap();
        assert_eq!((pace.s_per_token, pace.tokens_per_answer), (0.2, 100.0));
        assert_eq!(pace.answer().as_millis(), 20_000);
        assert_eq!(human_duration(Duration::from_secs(600)), "10 min");
    }
}
