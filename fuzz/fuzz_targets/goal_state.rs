//! The goal state: never a panic; a parsed one makes a health report that carries its
//! incarnation and container id.
#![no_main]
use azprov::azure::wireserver::{emit_health, parse_goal_state, Health};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(gs) = parse_goal_state(data) {
        let body = String::from_utf8(emit_health(&gs, &Health::Ready)).expect("UTF-8 body");
        assert!(body.contains(&format!(
            "<GoalStateIncarnation>{}</GoalStateIncarnation>",
            gs.incarnation
        )));
    }
});
