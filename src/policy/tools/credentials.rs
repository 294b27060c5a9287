//! The `credentials` argument of create-machine and run-once: bindings the operator declared,
//! named by the agent, put into the machine's spec. The values never pass here: the local fleet
//! supplies them before each boot (`crate::process::credentials`).

use crate::fleet::{Capabilities, CreateSpec, Egress, Feature};
use crate::policy::error::ToolError;
use crate::process::credentials::Supplier;

/// Puts the bindings `names` asks for into `spec`, once they are known, their values are
/// there to supply, and the fleet can take them; answers the names to record for the machine.
/// Their hosts join a machine's allow list (a blocked machine gets one of them): the operator
/// declared those hosts as where the value may go, and a request that cannot leave the
/// machine would carry nothing.
pub(super) fn apply(
    supplier: &Supplier,
    capabilities: &Capabilities,
    names: Option<&[String]>,
    spec: &mut CreateSpec,
) -> Result<Vec<String>, ToolError> {
    let names = match names {
        None | Some([]) => return Ok(Vec::new()),
        Some(names) => names,
    };
    if let Some(why) = capabilities.lacks(Feature::Credentials) {
        return Err(ToolError::argument("credentials", why));
    }
    let bindings = supplier
        .resolve(names)
        .map_err(|why| ToolError::argument("credentials", why))?;
    for binding in &bindings {
        supplier
            .check_value(binding)
            .map_err(|why| ToolError::argument("credentials", why))?;
    }
    let hosts: Vec<String> = bindings.iter().flat_map(|b| b.hosts.clone()).collect();
    spec.egress = match std::mem::replace(&mut spec.egress, Egress::Blocked) {
        Egress::Open => Egress::Open,
        Egress::Blocked => Egress::Allow {
            hosts,
            cidrs: Vec::new(),
        },
        Egress::Allow {
            hosts: mut allowed,
            cidrs,
        } => {
            for host in hosts {
                if !allowed.contains(&host) {
                    allowed.push(host);
                }
            }
            Egress::Allow {
                hosts: allowed,
                cidrs,
            }
        }
    };
    spec.credentials = bindings.iter().map(|b| b.spec()).collect();
    Ok(bindings.iter().map(|b| b.name.clone()).collect())
}
