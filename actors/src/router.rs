//! ConnectorRouter: the worker's root actor. It owns one ConnectorSupervisor per running connector and
//! routes the worker's requests to them.

use std::collections::BTreeMap;

use actix::prelude::*;

use crate::error::RuntimeError;
use crate::status::StatusBoard;
use crate::supervisor::{
    AssignTasks, ConnectorPlan, ConnectorSupervisor, KillTask, Ready, RestartTask, SetTaskCount,
    StopConnector,
};

pub struct ConnectorRouter {
    board: StatusBoard,
    connectors: BTreeMap<String, Addr<ConnectorSupervisor>>,
}

impl ConnectorRouter {
    pub fn new(board: StatusBoard) -> Self {
        ConnectorRouter {
            board,
            connectors: BTreeMap::new(),
        }
    }

    fn find(&self, name: &str) -> Result<Addr<ConnectorSupervisor>, RuntimeError> {
        self.connectors
            .get(name)
            .cloned()
            .ok_or_else(|| RuntimeError::UnknownConnector(name.to_owned()))
    }
}

impl Actor for ConnectorRouter {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "Result<(), RuntimeError>")]
pub struct Start(pub ConnectorPlan);

#[derive(Message)]
#[rtype(result = "Result<(), RuntimeError>")]
pub struct Stop(pub String);

#[derive(Message)]
#[rtype(result = "Result<(), RuntimeError>")]
pub struct Resize(pub String, pub usize);

#[derive(Message)]
#[rtype(result = "Result<(), RuntimeError>")]
pub struct Kill(pub String, pub u32);

/// Restart one task of a connector.
#[derive(Message)]
#[rtype(result = "Result<(), RuntimeError>")]
pub struct RestartOne(pub String, pub u32);

impl Handler<RestartOne> for ConnectorRouter {
    type Result = ResponseFuture<Result<(), RuntimeError>>;

    fn handle(&mut self, msg: RestartOne, _ctx: &mut Context<Self>) -> Self::Result {
        let found = self.find(&msg.0);
        Box::pin(async move {
            found?
                .send(RestartTask(msg.1))
                .await
                .map_err(|_| RuntimeError::WorkerStopped)?
        })
    }
}

/// Names of the running connectors.
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct List;

impl Handler<Start> for ConnectorRouter {
    type Result = ResponseFuture<Result<(), RuntimeError>>;

    fn handle(&mut self, msg: Start, _ctx: &mut Context<Self>) -> Self::Result {
        let name = msg.0.key.clone();
        // An actor that died (a panic) no longer runs its connector: it may be started again.
        if self.connectors.get(&name).is_some_and(Addr::connected) {
            return Box::pin(async move { Err(RuntimeError::ConnectorExists(name)) });
        }
        let addr = ConnectorSupervisor::new(msg.0, self.board.clone()).start();
        self.connectors.insert(name, addr.clone());
        // Answer once the connector has started, so its status is there for the caller.
        Box::pin(async move {
            addr.send(Ready)
                .await
                .map_err(|_| RuntimeError::WorkerStopped)
        })
    }
}

impl Handler<Stop> for ConnectorRouter {
    type Result = ResponseActFuture<Self, Result<(), RuntimeError>>;

    fn handle(&mut self, msg: Stop, _ctx: &mut Context<Self>) -> Self::Result {
        let name = msg.0;
        let found = self.find(&name);
        let fut = async move {
            let addr = found?;
            // An actor that died (a panic) has nothing left to stop: it counts as stopped, so
            // the connector can be deleted or started again.
            if let Ok(stopped) = addr.send(StopConnector).await {
                // A dropped sender means the connector actor is gone: nothing left to wait for.
                let _ = stopped.await;
            }
            Ok(())
        };
        Box::pin(fut.into_actor(self).map(move |result, act, _ctx| {
            if result.is_ok() {
                act.connectors.remove(&name);
                act.board.connector_removed(&name);
            }
            result
        }))
    }
}

impl Handler<Resize> for ConnectorRouter {
    type Result = ResponseFuture<Result<(), RuntimeError>>;

    fn handle(&mut self, msg: Resize, _ctx: &mut Context<Self>) -> Self::Result {
        let found = self.find(&msg.0);
        Box::pin(async move {
            found?
                .send(SetTaskCount(msg.1))
                .await
                .map_err(|_| RuntimeError::WorkerStopped)?
        })
    }
}

/// Run only these tasks of a connector here (distributed mode).
#[derive(Message)]
#[rtype(result = "Result<(), RuntimeError>")]
pub struct Assign(pub String, pub Option<std::collections::BTreeSet<u32>>);

impl Handler<Assign> for ConnectorRouter {
    type Result = ResponseFuture<Result<(), RuntimeError>>;

    fn handle(&mut self, msg: Assign, _ctx: &mut Context<Self>) -> Self::Result {
        let found = self.find(&msg.0);
        Box::pin(async move {
            found?
                .send(AssignTasks(msg.1))
                .await
                .map_err(|_| RuntimeError::WorkerStopped)?
        })
    }
}

impl Handler<Kill> for ConnectorRouter {
    type Result = ResponseFuture<Result<(), RuntimeError>>;

    fn handle(&mut self, msg: Kill, _ctx: &mut Context<Self>) -> Self::Result {
        let found = self.find(&msg.0);
        Box::pin(async move {
            found?
                .send(KillTask(msg.1))
                .await
                .map_err(|_| RuntimeError::WorkerStopped)?
        })
    }
}

impl Handler<List> for ConnectorRouter {
    type Result = Vec<String>;

    fn handle(&mut self, _msg: List, _ctx: &mut Context<Self>) -> Vec<String> {
        self.connectors.keys().cloned().collect()
    }
}
