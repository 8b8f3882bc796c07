"""Power paths: SNMP PDUs, IPMI, Redfish, smart plugs and SSH behind one verified interface."""
