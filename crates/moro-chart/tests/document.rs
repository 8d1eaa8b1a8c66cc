//! The stacked document is well-formed XML whose height is the panels' and whose text is
//! escaped (a model id with `<` or `&` cannot break it).

use moro_chart::{Breakdown, FitRow, FitTable, LineChart, Segment, Series, document};

#[test]
fn panels_stack_into_one_well_formed_svg() {
    let b = Breakdown {
        title: "Model <x> & \"y\"".into(),
        segments: vec![
            Segment {
                label: "weights".into(),
                bytes: 7 << 30,
            },
            Segment {
                label: "activations <peak>".into(),
                bytes: 3 << 30,
            },
        ],
        bound: Some(11 << 30),
        capacity: Some(("RTX 4090".into(), 24 << 30)),
    }
    .panel();
    let l = LineChart {
        title: "peak against sequence length".into(),
        x_label: "tokens".into(),
        series: vec![Series {
            name: "sdpa".into(),
            points: vec![(512, Some(1 << 30)), (1024, Some(2 << 30))],
        }],
        capacity: None,
        marked: None,
        ceiling: None,
    }
    .panel();
    let f = FitTable {
        title: "fit".into(),
        rows: vec![FitRow {
            label: "1 × A".into(),
            detail: "one GPU".into(),
            peak: 1,
            bound: 2,
            memory: 4,
        }],
        does_not_fit: vec![],
    }
    .panel();
    let heights = b.height + l.height + f.height;
    let svg = document(&[b, l, f]);
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.attribute("height"), Some(heights.to_string().as_str()));
    let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
    assert!(texts.contains(&"Model <x> & \"y\""), "{texts:?}");
    assert_eq!(doc.descendants().filter(|n| n.has_tag_name("g")).count(), 3);
}
