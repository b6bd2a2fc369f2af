//! `cargo run -p nightmail-transcribe --example transcribe -- MODEL_DIR FILE...`: prints each
//! file's transcript, for trying a model or an audio file by hand.
fn main() {
    let mut args = std::env::args().skip(1);
    let model = args.next().expect("usage: transcribe MODEL_DIR FILE...");
    let transcriber =
        nightmail_transcribe::Transcriber::open(std::path::Path::new(&model)).unwrap_or_else(|e| panic!("{e}"));
    for file in args {
        let audio = std::fs::read(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
        let start = std::time::Instant::now();
        match transcriber.transcribe(&audio, None, Some(&file)) {
            Ok(t) => {
                println!("{file}: {:.2} s of audio in {:.2} s: {}", t.seconds, start.elapsed().as_secs_f32(), t.text)
            }
            Err(e) => println!("{file}: {e}"),
        }
    }
}
