//! MiniMax-M2 (MiniMax-M2.jinja): `<minimax:tool_call>` around `<invoke name="NAME">` elements of
//! `<parameter name="K">V</parameter>`, a value bare where it is a string, else `tojson`.

use super::ParsedTurn;
use super::scan::{Tags, Turn, loose_value, sections, xml_calls, xml_params};

pub(super) const OPEN: &str = "<minimax:tool_call>";
const CLOSE: &str = "</minimax:tool_call>";
const EXPECTED: &str = "<minimax:tool_call>\n<invoke name=\"NAME\">\n<parameter name=\"KEY\">VALUE</parameter>\n</invoke>\n</minimax:tool_call>";
const TAGS: Tags = Tags {
    call: "<invoke",
    call_close: "</invoke>",
    name_attr: "name",
    param: "<parameter",
    param_close: "</parameter>",
    key_attr: "name",
    header_end: ">",
};

pub(super) fn parse(text: &str) -> ParsedTurn {
    let mut turn = Turn::new(&["[e~["], EXPECTED);
    sections(text, OPEN, CLOSE, &mut turn, &|section, turn| {
        xml_calls(section, &TAGS, turn, &|_, body| xml_params(body, &TAGS, &|_, v| Ok(loose_value(v))))
    });
    turn.finish()
}
