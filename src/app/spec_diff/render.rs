//! The report as Markdown, for a developer reading it before a bump.

use super::model::{Api, Classification, FieldChange, OperationStatus, OverrideCheck, Report};

impl Report {
    pub fn markdown(&self) -> String {
        let mut s = self.header();
        let p = &self.parity;
        s.push_str(&format!(
            "## Parity\n\n{} operations on {} paths: {} called, {} omitted on purpose, {} unknown.\n\n",
            p.operations, p.paths, p.called, p.omitted, p.unknown
        ));
        for (title, status) in [
            ("Added", OperationStatus::Added),
            ("Removed", OperationStatus::Removed),
            ("Changed", OperationStatus::Changed),
        ] {
            s.push_str(&self.operations_section(title, status));
        }
        s.push_str("## Overrides\n\n");
        if self.overrides.is_empty() {
            s.push_str("None.\n");
        }
        for o in &self.overrides {
            s.push_str(&override_line(o));
        }
        s
    }

    fn header(&self) -> String {
        let api = match self.api {
            Api::Local => "smolvm (local API)",
            Api::Cloud => "smol cloud",
        };
        let release = self
            .release
            .as_deref()
            .unwrap_or("unknown (a spec file was given)");
        let verdict = if self.needs_decision {
            "**needs a decision** (unknown operations, breaking changes or stale overrides)"
        } else {
            "nothing needs a decision"
        };
        let mut s = format!("# Spec diff: {api}\n\n");
        s.push_str(&format!("- baseline: `{}`\n", self.baseline));
        s.push_str(&format!("- candidate release: {release}\n"));
        // A release's document need not carry its release number (smolvm 1.32.2 says 0.5.2), so
        // the note quotes this document's own claim next to the release it came from.
        let version = self.spec_version.as_deref().unwrap_or("none");
        let claim = match (&self.release, &self.spec_version) {
            (Some(release), Some(_)) => format!("{release} says {version}"),
            (Some(release), None) => format!("{release} says nothing"),
            (None, _) => "the release is not known".to_owned(),
        };
        s.push_str(&format!(
            "- candidate `info.version`: {version} (reported, not trusted: {claim})\n"
        ));
        s.push_str(&format!("- verdict: {verdict}\n\n"));
        s
    }

    fn operations_section(&self, title: &str, status: OperationStatus) -> String {
        let ops: Vec<_> = self
            .operations
            .iter()
            .filter(|o| o.status == status)
            .collect();
        let mut s = format!("## {title} operations ({})\n\n", ops.len());
        if ops.is_empty() {
            s.push_str("None.\n\n");
            return s;
        }
        for op in ops {
            s.push_str(&format!(
                "- `{} {}` ({}): {}\n",
                op.method,
                op.path,
                op.operation_id,
                describe(&op.classification)
            ));
            for c in &op.changes {
                s.push_str(&change_line(c));
            }
        }
        s.push('\n');
        s
    }
}

fn change_line(c: &FieldChange) -> String {
    let field = if c.field.is_empty() {
        String::new()
    } else {
        format!(" `{}`", c.field)
    };
    let breaking = if c.breaking { " **breaking**" } else { "" };
    format!(
        "  - {}{field}: {} ({}){breaking}\n",
        c.place, c.change, c.detail
    )
}

fn override_line(o: &OverrideCheck) -> String {
    let detail = if o.detail.is_empty() {
        String::new()
    } else {
        format!(": {}", o.detail)
    };
    format!("- `{}`: {}{detail}\n", o.id, o.status)
}

fn describe(c: &Classification) -> String {
    match c {
        Classification::Used { tools } => format!("used by {}", tools.join(", ")),
        Classification::Internal { why } => format!("used by the server itself ({why})"),
        Classification::Omitted { reason } => format!("omitted: {reason}"),
        Classification::Unknown => {
            "**unknown**: neither used nor recorded as omitted; decide".into()
        }
    }
}
