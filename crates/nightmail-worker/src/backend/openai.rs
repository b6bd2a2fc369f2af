//! An OpenAI-compatible chat completions server: llama.cpp's server, vLLM, SGLang, a cloud API.
//! Requests stream (`stream: true`, server-sent events), so progress is seen token by token;
//! reasoning deltas (`reasoning_content`, `reasoning`) and inline `<think>` are kept apart from
//! the answer.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::{Backend, BackendError, BoxFuture, Event, Outcome, Request, ThinkSplitter};

pub struct OpenAi {
    client: reqwest::Client,
    /// Base URL without the trailing slash, e.g. `http://127.0.0.1:8080/v1`.
    url: String,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
    retries: u32,
}

impl OpenAi {
    pub fn new(url: &str, model: &str, api_key: Option<String>, timeout: Duration, retries: u32) -> OpenAi {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .expect("an HTTP client with default TLS settings builds");
        OpenAi { client, url: url.trim_end_matches('/').to_string(), model: model.to_string(), api_key, timeout, retries }
    }

    fn body(&self, request: &Request) -> Value {
        let messages: Vec<Value> =
            request.turns.iter().map(|t| json!({ "role": t.role.as_str(), "content": t.content })).collect();
        let mut body = json!({
            "model": request.model.as_deref().unwrap_or(&self.model),
            "messages": messages,
            "stream": true,
            "stream_options": { "include_usage": true },
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        });
        if let Some(reasoning) = request.reasoning {
            // The convention of llama.cpp, vLLM and SGLang for templates that can think.
            body["chat_template_kwargs"] = json!({ "enable_thinking": reasoning });
        }
        body
    }

    /// Sends the request, retrying refused connections, 429 and 5xx with backoff (1 s, 2 s, ...).
    async fn send(&self, body: &Value, stop: &mut watch::Receiver<bool>) -> Result<reqwest::Response, BackendError> {
        let endpoint = format!("{}/chat/completions", self.url);
        let mut last = String::new();
        for attempt in 0..=self.retries {
            if attempt > 0 {
                let wait = Duration::from_secs(1 << (attempt - 1).min(6));
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.wait_for(|s| *s) => return Err(BackendError::Stopped),
                }
            }
            let mut post = self.client.post(&endpoint).json(body);
            if let Some(key) = &self.api_key {
                post = post.bearer_auth(key);
            }
            let sent = tokio::select! {
                sent = tokio::time::timeout(self.timeout, post.send()) => sent,
                _ = stop.wait_for(|s| *s) => return Err(BackendError::Stopped),
            };
            match sent {
                Err(_) => last = format!("{endpoint} did not answer within {} s", self.timeout.as_secs()),
                Ok(Err(e)) => last = format!("{endpoint}: {e}"),
                Ok(Ok(response)) => {
                    let status = response.status();
                    if status.is_success() {
                        return Ok(response);
                    }
                    let text = response.text().await.unwrap_or_default();
                    let text: String = text.chars().take(500).collect();
                    last = format!("{endpoint} answered {status}: {text}");
                    if !(status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408) {
                        return Err(BackendError::Permanent(last));
                    }
                }
            }
            tracing::warn!(attempt, "openai backend: {last}");
        }
        Err(BackendError::Transient(last))
    }

    async fn run(
        &self,
        request: &Request,
        events: mpsc::UnboundedSender<Event>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Outcome, BackendError> {
        let body = self.body(request);
        let response = self.send(&body, &mut stop).await?;
        let mut stream = response.bytes_stream().eventsource();
        let mut outcome = Outcome { model: request.model.clone().unwrap_or_else(|| self.model.clone()), ..Outcome::default() };
        let mut think = ThinkSplitter::default();
        let (mut content_chunks, mut reasoning_chunks) = (0u64, 0u64);
        let mut usage_seen = false;
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(self.timeout, stream.next()) => next,
                _ = stop.wait_for(|s| *s) => return Err(BackendError::Stopped),
            };
            let event = match next {
                Err(_) => {
                    return Err(BackendError::Transient(format!(
                        "the server sent nothing for {} s in the middle of an answer",
                        self.timeout.as_secs()
                    )));
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(BackendError::Transient(format!("the answer stream broke: {e}"))),
                Ok(Some(Ok(event))) => event,
            };
            if event.data.trim() == "[DONE]" {
                break;
            }
            let Ok(chunk) = serde_json::from_str::<Value>(&event.data) else {
                tracing::warn!(data = %event.data.chars().take(200).collect::<String>(), "openai backend: unreadable chunk");
                continue;
            };
            if let Some(error) = chunk.get("error") {
                return Err(BackendError::Transient(format!("the server reported an error mid-answer: {error}")));
            }
            if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
                usage_seen = true;
                outcome.prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0);
                let completion = usage["completion_tokens"].as_u64().unwrap_or(0);
                outcome.reasoning_tokens =
                    usage["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap_or(0);
                outcome.output_tokens = completion.saturating_sub(outcome.reasoning_tokens);
            }
            let Some(choice) = chunk["choices"].get(0) else { continue };
            if let Some(reason) = choice["finish_reason"].as_str() {
                outcome.finish_reason = reason.to_string();
            }
            let delta = &choice["delta"];
            for key in ["reasoning_content", "reasoning"] {
                if let Some(text) = delta[key].as_str().filter(|t| !t.is_empty()) {
                    reasoning_chunks += 1;
                    outcome.reasoning.push_str(text);
                    let _ = events.send(Event::Reasoning(text.to_string()));
                }
            }
            if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
                content_chunks += 1;
                for e in think.push(text) {
                    record(&mut outcome, &events, e);
                }
            }
        }
        for e in think.finish() {
            record(&mut outcome, &events, e);
        }
        if !usage_seen {
            // Servers that send no usage stream about one token per chunk.
            outcome.output_tokens = content_chunks;
            outcome.reasoning_tokens = reasoning_chunks;
        }
        if outcome.content.trim().is_empty() && outcome.reasoning.trim().is_empty() {
            return Err(BackendError::Transient("the server's answer was empty".into()));
        }
        Ok(outcome)
    }
}

fn record(outcome: &mut Outcome, events: &mpsc::UnboundedSender<Event>, event: Event) {
    match &event {
        Event::Content(t) => outcome.content.push_str(t),
        Event::Reasoning(t) => outcome.reasoning.push_str(t),
    }
    let _ = events.send(event);
}

impl Backend for OpenAi {
    fn describe(&self) -> String {
        format!("openai {} at {}", self.model, self.url)
    }

    fn generate<'a>(
        &'a self,
        request: &'a Request,
        events: mpsc::UnboundedSender<Event>,
        stop: watch::Receiver<bool>,
    ) -> BoxFuture<'a, Result<Outcome, BackendError>> {
        Box::pin(self.run(request, events, stop))
    }
}
