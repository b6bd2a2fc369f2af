//! An OpenAI chat answer asked for whole (`"stream": false`): the form every compatible server
//! gives tool calls in. Some refuse to stream them (llama-cpp-python's server answers "Automatic
//! streaming tool choice is not supported"), so the OpenAI backend falls back to this for a request
//! with tools.

use serde_json::Value;

use super::{BackendAnswer, BackendError, CallRequest};

/// The answer in a whole `chat.completion` object.
pub fn answer(body: &Value, model: String) -> Result<BackendAnswer, BackendError> {
    let Some(choice) = body["choices"].get(0) else {
        return Err(BackendError::Transient(format!(
            "the server's answer has no choices: {}",
            body.to_string().chars().take(200).collect::<String>()
        )));
    };
    let message = &choice["message"];
    let text = |key: &str| message[key].as_str().unwrap_or_default().to_string();
    let reasoning = [text("reasoning_content"), text("reasoning")].concat();
    let calls: Vec<CallRequest> = message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .enumerate()
                .map(|(i, call)| {
                    let function = &call["function"];
                    let name = function["name"].as_str().unwrap_or_default().to_string();
                    let arguments = match &function["arguments"] {
                        Value::String(text) => text.clone(),
                        other => other.to_string(),
                    };
                    CallRequest::named(
                        call["id"].as_str().map_or_else(|| format!("call_{i}"), str::to_string),
                        name,
                        arguments,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let usage = &body["usage"];
    let reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap_or(0);
    let answer = BackendAnswer {
        content: text("content"),
        reasoning,
        prompt_tokens: usage["prompt_tokens"].as_u64(),
        output_tokens: usage["completion_tokens"].as_u64().unwrap_or(0).saturating_sub(reasoning_tokens),
        reasoning_tokens,
        finish_reason: choice["finish_reason"].as_str().unwrap_or("stop").to_string(),
        model,
        calls,
        ..BackendAnswer::default()
    };
    if answer.content.trim().is_empty() && answer.reasoning.trim().is_empty() && answer.calls.is_empty() {
        return Err(BackendError::Transient("the server's answer was empty".into()));
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn calls_content_and_usage_are_read_from_a_whole_answer() {
        // As llama-cpp-python's server answers with chat_format "chatml-function-calling".
        let body = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call__0_fetch", "type": "function", "function": {"name": "fetch", "arguments": "{\"url\": \"https://b.example/\"} "}}]}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 14}});
        let answer = answer(&body, "m".into()).unwrap();
        assert_eq!(answer.calls.len(), 1);
        assert_eq!((answer.calls[0].id.as_str(), answer.calls[0].name.as_str()), ("call__0_fetch", "fetch"));
        assert_eq!(answer.calls[0].arguments, "{\"url\": \"https://b.example/\"} ");
        assert_eq!(
            (answer.prompt_tokens, answer.output_tokens, answer.finish_reason.as_str()),
            (Some(120), 14, "tool_calls")
        );
        let said = json!({"choices": [{"message": {"content": "It is 4%."}, "finish_reason": "stop"}]});
        assert_eq!(answer_of(&said).content, "It is 4%.");
        assert!(super::answer(&json!({"choices": [{"message": {"content": ""}}]}), "m".into()).is_err());
        assert!(super::answer(&json!({"error": "x"}), "m".into()).is_err());
    }

    fn answer_of(body: &Value) -> BackendAnswer {
        super::answer(body, "m".into()).unwrap()
    }
}
