//! AFL++ target: see `sluice_fuzz::ws_frames` for what must hold.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        sluice_fuzz::ws_frames(data);
    });
}
