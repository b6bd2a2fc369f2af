//! DeepSeek-V3.2's and V4's DSML (deepseek-ai-DeepSeek-V3.2.jinja, deepseek-ai-DeepSeek-V4.jinja):
//! `<｜DSML｜function_calls>` (V4: `tool_calls`) around `<｜DSML｜invoke name="NAME">` elements of
//! `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`, where `string="true"`
//! marks a bare string and `false` a JSON value (the templates' own instructions).

use serde_json::Value as Json;

use super::ParsedTurn;
use super::scan::{Tags, Turn, attr, loose_value, sections, xml_calls, xml_params};

pub(super) struct Block {
    pub open: &'static str,
    close: &'static str,
    expected: &'static str,
}

pub(super) const V32: Block = Block {
    open: "<｜DSML｜function_calls>",
    close: "</｜DSML｜function_calls>",
    expected: "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"NAME\">\n<｜DSML｜parameter name=\"KEY\" string=\"true\">VALUE</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
};

pub(super) const V4: Block = Block {
    open: "<｜DSML｜tool_calls>",
    close: "</｜DSML｜tool_calls>",
    expected: "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"NAME\">\n<｜DSML｜parameter name=\"KEY\" string=\"true\">VALUE</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
};

const TAGS: Tags = Tags {
    call: "<｜DSML｜invoke",
    call_close: "</｜DSML｜invoke>",
    name_attr: "name",
    param: "<｜DSML｜parameter",
    param_close: "</｜DSML｜parameter>",
    key_attr: "name",
    header_end: ">",
};

pub(super) fn parse(text: &str, block: &Block) -> ParsedTurn {
    let mut turn = Turn::new(&["<｜end▁of▁sentence｜>"], block.expected);
    sections(text, block.open, block.close, &mut turn, &|section, turn| {
        xml_calls(section, &TAGS, turn, &|_, body| xml_params(body, &TAGS, &value))
    });
    turn.finish()
}

fn value(header: &str, text: &str) -> Result<Json, String> {
    match attr(header, "string").as_deref() {
        Some("true") => Ok(Json::String(text.to_string())),
        Some("false") => serde_json::from_str(text.trim())
            .map_err(|e| format!("it says string=\"false\" but is not JSON ({e}); set string=\"true\" for text")),
        _ => Ok(loose_value(text)),
    }
}
